"""DPSGD with constant clipping (Abadi et al.), or normalised (De et al.; Zhao Alg. 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import PositiveFloat

from dpfair.lazy import lazy_module
from dpfair.methods.base import Method, State
from dpfair.methods.registry import BuildContext, MethodSpec, register_method

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_module("torch")  # loads when the rule first runs, not when its config is checked


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
