"""FairLens (Tran et al. 2021, as implemented by Esipova et al., Alg. 4): regularised DPSGD.

Per-sample gradients are those of ``l_i + gamma1 R1 + gamma2 R2``, two batch regularisers
comparing group 0 with group 1 (:mod:`dpfair.engine.regularised`): every ``g'_i = g_i + r``
with the same ``r``, so ``g'_i`` depends on other samples and clipping it at ``C`` does not
bound the sensitivity: ``privacy_guarantee = "heuristic"``.

Defaults: Tran via Esipova (``gamma1 = gamma2 = 1``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import NonNegativeFloat

from dpfair.methods.base import Method
from dpfair.methods.dpsgd import Dpsgd
from dpfair.methods.keyword_spec import FormerSpec
from dpfair.methods.registry import BuildContext, register_method

if TYPE_CHECKING:
    from torch import nn

    from dpfair.engine.gradients import EngineKind, PerSampleGradients


class FairLens(Dpsgd):
    """FairLens: DPSGD clipping at ``C`` of the regularised per-sample gradients (heuristic)."""

    privacy_guarantee = "heuristic"
    batch_terms = True

    def __init__(self, C: float, gamma1: float, gamma2: float, *, name: str = "fairlens") -> None:
        super().__init__(C, name=name)
        self.gamma1, self.gamma2 = gamma1, gamma2

    def per_sample_gradients(self, model: nn.Module, kind: EngineKind) -> PerSampleGradients:
        from dpfair.engine.gradients import make_engine
        from dpfair.engine.regularised import RegularisedGradients

        return RegularisedGradients(make_engine(model, kind), self.C, self.gamma1, self.gamma2)


@register_method
class FairLensConfig(FormerSpec):
    """FairLens for two groups (R1 and R2 compare group 0 with group 1)."""

    method_class = FairLens
    name: Literal["fairlens"] = "fairlens"
    gamma1: NonNegativeFloat = 1.0
    gamma2: NonNegativeFloat = 1.0

    def build(self, ctx: BuildContext) -> Method:
        if ctx.n_groups != 2:
            raise ValueError(f"fairlens is defined for two groups, got n_groups={ctx.n_groups}")
        return super().build(ctx)
