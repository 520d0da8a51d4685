"""DP-SAT (Park et al.): DPSGD clipping of per-sample gradients at one ascended point shared by
all samples, along the previous *private* gradient: ``g_i = grad l_i(theta + rho g~_{t-1} /
|g~_{t-1}|)``, on any path. Using only the released gradient is post-processing, so the
sensitivity argument of DPSGD holds.

Defaults: Knolle Table 2 (CIFAR-10: ``rho = 0.086``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import NonNegativeFloat

from dpfair.methods.dpsgd import Dpsgd
from dpfair.methods.keyword_spec import FormerSpec
from dpfair.methods.registry import register_method

if TYPE_CHECKING:
    from torch import nn

    from dpfair.engine.gradients import EngineKind, PerSampleGradients


class DpSat(Dpsgd):
    """DP-SAT (Park et al.): DPSGD clipping of gradients at the shared ascended point."""

    def __init__(self, C: float, rho: float, *, name: str = "dp_sat") -> None:
        super().__init__(C, name=name)
        self.rho = rho

    def per_sample_gradients(self, model: nn.Module, kind: EngineKind) -> PerSampleGradients:
        from dpfair.engine.ascent import SharedAscent
        from dpfair.engine.gradients import make_engine

        return SharedAscent(make_engine(model, kind), self.rho)


@register_method
class DpSatConfig(FormerSpec):
    method_class = DpSat
    name: Literal["dp_sat"] = "dp_sat"
    rho: NonNegativeFloat = 0.086
