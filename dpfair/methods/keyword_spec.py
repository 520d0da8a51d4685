"""Configs whose rule takes exactly the config's hyperparameters as keywords (no method of its
own: the registry imports it with the others and finds nothing to register)."""

from __future__ import annotations

from typing import Self

from pydantic import PositiveFloat

from dpfair.methods.base import Method
from dpfair.methods.registry import BuildContext, MethodSpec


class KeywordSpec(MethodSpec):
    """``build`` is ``method_class(**hyperparameters)``: every field but ``name``."""

    def build(self, ctx: BuildContext) -> Method:
        return self.method_class(**self.model_dump(exclude={"name"}))


class FormerSpec(KeywordSpec):
    """DPSGD clipping at ``C`` of per-sample gradients formed another way (BAM, DP-SAT,
    FairLens: :meth:`dpfair.methods.base.Method.per_sample_gradients`); its example
    clips at 0.7."""

    C: PositiveFloat = 1.0

    @classmethod
    def example(cls) -> Self:
        return cls(C=0.7)
