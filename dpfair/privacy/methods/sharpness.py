"""Sharpness-aware gradient formers, both clipped at C like DPSGD (DESIGN.md section 4).

* BAM (Knolle et al., Alg. 2 line 4; Eq. 14): a per-sample ascent step,
  ``g_i = grad l_i(theta + lam grad l_i(theta) / |grad l_i(theta)|)``, on the materialised path.
* DP-SAT (Park et al.): one ascent step shared by all samples along the previous *private*
  gradient, ``g_i = grad l_i(theta + rho g~_{t-1} / |g~_{t-1}|)``, on any path. Using only the
  released gradient is post-processing, so the sensitivity argument of DPSGD holds.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpfair.privacy.gradients import (
    EngineKind,
    LossFn,
    Materialized,
    PerSampleFn,
    PerSampleGradients,
    make_engine,
    trainable_parameters,
)
from dpfair.privacy.methods.clipping import Dpsgd


def _global_norm(tensors: list[Tensor]) -> Tensor:
    return torch.stack([t.square().sum() for t in tensors]).sum().sqrt()


class AscentMaterialized(Materialized):
    """Materialised per-sample gradients taken after a per-sample SAM ascent of radius ``lam``."""

    def __init__(self, lam: float) -> None:
        super().__init__()
        self.lam = lam

    def per_sample_fn(self, grad_value: PerSampleFn) -> PerSampleFn:
        def ascended(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> tuple[dict, Tensor]:
            g, loss = grad_value(p, xi, yi)
            scale = self.lam / _global_norm(list(g.values())).clamp(
                min=torch.finfo(loss.dtype).tiny
            )
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


class SharedAscent(PerSampleGradients):
    """Wraps an engine: per-sample gradients at ``theta + rho d / |d|``, ``d`` the last release."""

    def __init__(self, inner: PerSampleGradients, rho: float) -> None:
        self.inner, self.rho = inner, rho
        self.direction: list[Tensor] | None = None

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        if self.direction is None:  # first step: nothing released yet
            norms = self.inner.compute(model, loss_fn, x, y, groups)
        else:
            params = trainable_parameters(model)
            saved = [p.detach().clone() for p in params]
            with torch.no_grad():
                for p, d in zip(params, self.direction, strict=True):
                    p.add_(d)
            try:
                norms = self.inner.compute(model, loss_fn, x, y, groups)
            finally:
                with torch.no_grad():
                    for p, s in zip(params, saved, strict=True):
                        p.copy_(s)
        self.losses = self.inner.losses
        return norms

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        return self.inner.weighted_grad(weights)

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        self.inner.add_weighted_grad(weights, into)

    def observe(self, private_grad: list[Tensor]) -> None:
        norm = _global_norm(private_grad)
        if torch.isfinite(norm) and norm > 0:
            self.direction = [(self.rho / norm) * g.detach() for g in private_grad]


class DpSat(Dpsgd):
    """DP-SAT (Park et al.): DPSGD clipping of gradients at the shared ascended point."""

    def __init__(self, C: float, rho: float, *, name: str = "dp_sat") -> None:
        super().__init__(C, name=name)
        self.rho = rho

    def per_sample_gradients(self, model: nn.Module, kind: EngineKind) -> PerSampleGradients:
        return SharedAscent(make_engine(model, kind), self.rho)
