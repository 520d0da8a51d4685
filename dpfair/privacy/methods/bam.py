"""BAM, bias-aware minimisation (Knolle et al., Alg. 2 line 4; Eq. 14): DPSGD clipping of
per-sample gradients taken after a per-sample ascent step,
``g_i = grad l_i(theta + lam grad l_i(theta) / |grad l_i(theta)|)``, on the materialised path.

Defaults: Knolle Table 2 (CIFAR-10: ``lam = 0.02``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import NonNegativeFloat, PositiveFloat
from torch import Tensor, nn

from dpfair.privacy.gradients import (
    EngineKind,
    Materialized,
    PerSampleFn,
    PerSampleGradients,
    global_norm,
)
from dpfair.privacy.methods.dpsgd import Dpsgd
from dpfair.privacy.methods.registry import BuildContext, MethodSpec, register_method


class AscentMaterialized(Materialized):
    """Materialised per-sample gradients taken after a per-sample SAM ascent of radius ``lam``."""

    def __init__(self, lam: float) -> None:
        super().__init__()
        self.lam = lam

    def per_sample_fn(self, grad_value: PerSampleFn) -> PerSampleFn:
        def ascended(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> tuple[dict, Tensor]:
            g, loss = grad_value(p, xi, yi)
            scale = self.lam / global_norm(list(g.values())).clamp(min=torch.finfo(loss.dtype).tiny)
            g_at, _ = grad_value({n: p[n] + scale * g[n] for n in p}, xi, yi)
            return g_at, loss

        return ascended


class Bam(Dpsgd):
    """Bias-aware minimisation (Knolle Alg. 2): DPSGD clipping of per-sample ascended gradients."""

    def __init__(self, C: float, lam: float, *, name: str = "bam") -> None:
        super().__init__(C, name=name)
        self.lam = lam

    def per_sample_gradients(self, model: nn.Module, kind: EngineKind) -> PerSampleGradients:
        if kind == "fast":
            raise ValueError("bam forms per-sample ascended gradients: materialised path only")
        return AscentMaterialized(self.lam)


@register_method
class BamConfig(MethodSpec):
    method_class = Bam
    name: Literal["bam"] = "bam"
    C: PositiveFloat = 1.0
    lam: NonNegativeFloat = 0.02

    def build(self, ctx: BuildContext) -> Bam:
        return Bam(self.C, self.lam)

    @classmethod
    def example(cls) -> BamConfig:
        return cls(C=0.7)
