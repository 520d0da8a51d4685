"""Gradient-space (Dirac) canaries, white-box (Steinke, Nasr & Jagielski 2023, Sec. 6).

A gradient canary is a training example whose per-sample gradient is crafted: ``norm · e_j``,
all of it on one parameter coordinate ``j`` (distinct and uniformly drawn per canary), with
a norm (:data:`CANARY_NORM`) above every clip bound, so that the method clips it to exactly
what it allows one example. Scoring is white-box: ``-(θ_T - θ_0)_j``, how far training moved
coordinate ``j`` against the canary's gradient.

Injection goes through the engine hook every method already has,
:meth:`dpfair.methods.Method.per_sample_gradients`: the audited method is built as
usual and its engine wrapped by :class:`CanaryGradients`, which hands the real rows of a batch
to the method's own engine and gives canary rows their crafted gradient (norm, and
``w_i · norm · e_j`` added to the step's sum). A canary row of the training split holds NaN
in its first input coordinate (real inputs are finite: the data checks refuse others) and its
canary index in the second. Everything else (Poisson sampling, count releases, noise, the
secret randomness) is the ordinary :func:`dpfair.training.train`.

The configuration is handed to ``train`` with ``model_copy``: the wrapper spec is not a
registered method (params.yaml cannot name it), and σ is fixed first from the real method's
plan, so ε is the real method's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from pydantic import ConfigDict, PrivateAttr
from torch import Tensor, nn

from dpfair.audit.canaries import Canaries, with_canaries
from dpfair.data.dataset import GroupedDataset, Split
from dpfair.engine.gradients import (
    EngineKind,
    LossFn,
    PerSampleGradients,
    trainable_parameters,
)
from dpfair.errors import ConfigError
from dpfair.methods import Method, MethodSpec, PrivacyGuarantee
from dpfair.methods.registry import BuildContext
from dpfair.models import build_model
from dpfair.training import TrainConfig, TrainResult, make_plan, train

#: a canary's gradient norm: above the clip bound of every method at its usual settings.
CANARY_NORM = 1e3


def _flat(params: Sequence[Tensor]) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params]).cpu()


class CanaryGradients(PerSampleGradients):
    """Wraps a method's engine: canary rows get the crafted gradient (module docstring)."""

    def __init__(self, inner: PerSampleGradients, model: nn.Module, coords: Tensor) -> None:
        self.inner, self.coords = inner, coords
        self.params = trainable_parameters(model)
        self.start = _flat(self.params)[coords]  # θ_0 at the canary coordinates
        self.offsets = np.cumsum([0] + [p.numel() for p in self.params])
        self._ids = torch.empty(0, dtype=torch.long)
        self._real = torch.empty(0, dtype=torch.bool)

    def compute(self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor,
                groups: Tensor | None = None) -> Tensor:
        flat = x.reshape(len(x), -1)
        self._real = ~torch.isnan(flat[:, 0])
        self._ids = flat[~self._real, 1].long().cpu()
        norms = torch.full((len(x),), CANARY_NORM, dtype=self.params[0].dtype, device=x.device)
        if bool(self._real.any()):
            real = self._real
            norms[real] = self.inner.compute(model, loss_fn, x[real], y[real],
                                             None if groups is None else groups[real])
            self.losses = self.inner.losses
        else:
            self.losses = norms.new_full((1,), math.nan)
        return norms

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        out = [torch.zeros_like(p) for p in self.params]
        self.add_weighted_grad(weights, out)
        return out

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        if bool(self._real.any()):
            self.inner.add_weighted_grad(weights[self._real], into)
        for w, j in zip(weights[~self._real].tolist(), self.coords[self._ids].tolist(),
                        strict=True):
            i = int(np.searchsorted(self.offsets, j, side="right")) - 1
            into[i].view(-1)[j - self.offsets[i]] += w * CANARY_NORM

    def observe(self, private_grad: list[Tensor]) -> None:
        self.inner.observe(private_grad)


class CanarySpec(MethodSpec):
    """The audited method with its engine wrapped; not registered (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    inner: Any
    coords: tuple[int, ...]
    _engines: list[CanaryGradients] = PrivateAttr(default_factory=list)

    @property
    def privacy_guarantee(self) -> PrivacyGuarantee:
        return self.inner.privacy_guarantee

    def build(self, ctx: BuildContext) -> Method:
        method = self.inner.build(ctx)
        own = method.per_sample_gradients
        coords = torch.tensor(self.coords)

        def wrapped(model: nn.Module, kind: EngineKind) -> PerSampleGradients:
            engine = CanaryGradients(own(model, kind), model, coords)
            self._engines.append(engine)
            return engine

        method.per_sample_gradients = wrapped  # type: ignore[method-assign]
        return method

    @classmethod
    def example(cls) -> CanarySpec:
        raise NotImplementedError("an audit wrapper, not a method to run on its own")


def _canary_rows(dataset: GroupedDataset, groups: Sequence[int], m: int) -> Split:
    n, width = m * len(groups), math.prod(dataset.input_shape)
    if width < 2:
        raise ConfigError("gradient canaries need inputs of at least two values; use "
                          "audit.kind: mislabel or ood")
    x = torch.zeros(n, width)
    x[:, 0], x[:, 1] = math.nan, torch.arange(n, dtype=torch.float32)
    g = torch.tensor(np.repeat(np.asarray(groups, dtype=np.int64), m))
    return Split(x.reshape(n, *dataset.input_shape), torch.zeros(n, dtype=torch.long), g)


def coordinates(config: TrainConfig, dataset: GroupedDataset) -> int:
    """The trainable parameters of ``config``'s model: one per gradient canary at most."""
    model = build_model(config.model, dataset.input_shape, dataset.n_classes)
    return sum(p.numel() for p in trainable_parameters(model))


def run(config: TrainConfig, dataset: GroupedDataset, groups: Sequence[int], m: int,
        rng: np.random.Generator) -> tuple[Canaries, np.ndarray, TrainResult]:
    """Train ``config`` with ``m`` Dirac canaries per group; their scores (module docstring)."""
    rows = _canary_rows(dataset, groups, m)
    included = rng.random(len(rows)) < 0.5
    canaries = Canaries(rows, included, np.empty(0, dtype=np.int64))
    audited = with_canaries(dataset, canaries)
    if not config.method.is_private:
        raise ConfigError("gradient canaries enter through a private method's per-sample "
                          "gradients; audit the non-private reference with mislabel or ood")
    n_params = coordinates(config, dataset)
    if n_params < len(rows):
        raise ConfigError(f"{len(rows)} gradient canaries need as many parameters, the model "
                          f"has {n_params}; lower audit.canaries")
    coords = rng.choice(n_params, size=len(rows), replace=False)
    plan = make_plan(config, len(audited.train), dataset.n_groups)
    spec = CanarySpec(name=config.method.name, inner=config.method,
                      coords=tuple(int(c) for c in coords))
    wrapped = config.model_copy(update={"method": spec, "sigma": plan.sigma,
                                        "target_epsilon": None})
    result = train(wrapped, audited)
    (engine,) = spec._engines
    moved = _flat(trainable_parameters(result.load_model()))[torch.tensor(coords)] - engine.start
    return canaries, -moved.double().numpy(), result
