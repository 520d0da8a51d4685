"""DP-SAT (Park et al.): DPSGD clipping of per-sample gradients at one ascended point shared by
all samples, along the previous *private* gradient: ``g_i = grad l_i(theta + rho g~_{t-1} /
|g~_{t-1}|)``, on any path. Using only the released gradient is post-processing, so the
sensitivity argument of DPSGD holds.

Defaults: Knolle Table 2 (CIFAR-10: ``rho = 0.086``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import NonNegativeFloat
from torch import Tensor, nn

from dpfair.privacy.gradients import (
    EngineKind,
    LossFn,
    PerSampleGradients,
    global_norm,
    make_engine,
    trainable_parameters,
)
from dpfair.privacy.methods.dpsgd import Dpsgd
from dpfair.privacy.methods.keyword_spec import FormerSpec
from dpfair.privacy.methods.registry import register_method


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
        norm = global_norm(private_grad)
        if torch.isfinite(norm) and norm > 0:
            self.direction = [(self.rho / norm) * g.detach() for g in private_grad]


class DpSat(Dpsgd):
    """DP-SAT (Park et al.): DPSGD clipping of gradients at the shared ascended point."""

    def __init__(self, C: float, rho: float, *, name: str = "dp_sat") -> None:
        super().__init__(C, name=name)
        self.rho = rho

    def per_sample_gradients(self, model: nn.Module, kind: EngineKind) -> PerSampleGradients:
        return SharedAscent(make_engine(model, kind), self.rho)


@register_method
class DpSatConfig(FormerSpec):
    method_class = DpSat
    name: Literal["dp_sat"] = "dp_sat"
    rho: NonNegativeFloat = 0.086
