"""DPSGD with constant clipping (Abadi et al.), or normalised (De et al.; Zhao Alg. 1)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import PositiveFloat
from torch import Tensor

from dpfair.privacy.methods.base import Method, State
from dpfair.privacy.methods.registry import BuildContext, MethodSpec, register_method


class Dpsgd(Method):
    """DPSGD: ``w_i = min(1, C / |g_i|)``, ``S = C`` (Abadi et al.; Xu Alg. 1 line 6).

    With ``normalize``: ``w_i = min(1/C, 1/|g_i|)``, ``S = 1`` (De et al.; Zhao Alg. 1).
    BAM, DP-SAT and FairLens subclass this rule and only change how ``g_i`` is formed.
    """

    def __init__(self, C: float, *, normalize: bool = False, name: str = "dpsgd") -> None:
        super().__init__(name)
        self.C, self.normalize = C, normalize

    def state(self) -> State:
        return {"C": self.C}

    def _weights(self, norms: Tensor, groups: Tensor) -> tuple[Tensor, float]:
        if self.normalize:
            return torch.minimum(1.0 / norms, torch.full_like(norms, 1.0 / self.C)), 1.0
        return (self.C / norms).clamp(max=1.0), self.C


@register_method
class DpsgdConfig(MethodSpec):
    method_class = Dpsgd
    name: Literal["dpsgd"] = "dpsgd"
    C: PositiveFloat = 1.0
    normalize: bool = False

    def build(self, ctx: BuildContext) -> Dpsgd:
        return Dpsgd(self.C, normalize=self.normalize)

    @classmethod
    def example(cls) -> DpsgdConfig:
        return cls(C=0.7)
