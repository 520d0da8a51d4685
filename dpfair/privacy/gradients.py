"""Per-sample gradient engine: per-sample norms, then the reweighted sum ``sum_i w_i g_i``.

Two implementations of one interface (DESIGN.md section 4):

* :class:`GhostClipping` -- the fast path. One forward and one backward (to the layer outputs
  only, so no parameter gradient is formed twice); forward hooks keep each supported layer's
  input ``a`` and output, autograd gives the output gradients ``d``. A layer's per-sample
  gradient is ``sum_t d_t a_t^T`` (``t`` runs over sequence positions, or over the im2col
  patches of a convolution), so its squared norm is ``|a|^2 |d|^2`` for a Linear applied once
  per sample (the ghost-norm trick), else ``<a a^T, d d^T>`` (the ``T x T`` Gram trick) or the
  norm of the materialised per-sample gradient of that layer, whichever is cheaper.
  A convolution's per-sample gradient is materialised by one batched matmul per kernel tap,
  never through an im2col tensor (``kh kw`` times the input size).
  The weighted sum is one contraction of the ``w``-scaled output gradients with the inputs,
  added in place to the tensors the caller passes (the step's noise).
  LayerNorm and GroupNorm parameters are small: their per-sample gradients are materialised
  from the same captured input and output gradient.
* :class:`Materialized` -- the reference: ``torch.func.vmap`` of ``torch.func.grad`` gives
  every per-sample gradient; it serves methods that need them (BAM) and any layer the fast
  path does not know.

``loss_fn(outputs, y)`` must return per-sample losses (``reduction="none"``). Samples must not
interact in the forward pass (no BatchNorm in training mode).

Overflow: both paths form ``|g_i|^2`` as a sum of squares in the model's dtype, so a sample whose
squared norm overflows (``|g_i|`` above ``sqrt(finfo.max)``, about ``1.8e19`` in float32) has an
infinite norm in both, and the rule gives it weight 0 (``Method.rule``); every other sample has
the same norm in both. Where a factor's squared norm ``|a|^2`` or ``|d|^2`` over- or underflows
while ``|g_i|^2`` does not (a saturated ``tanh`` on a huge input: ``d = 0``, ``|a|^2 = inf``),
the fast path first rescales the factors by opposite powers of two (exact; in
:mod:`dpfair.privacy.layer_grads`), so that its products, and ``w_i a`` or ``w_i d`` in the
weighted sum, stay in range.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from dpfair.privacy.layer_grads import (
    FAST_LAYERS,
    LayerGrads,
    layer_grads,
    mask_rows,
)

log = logging.getLogger(__name__)

LossFn = Callable[[Tensor, Tensor], Tensor]
EngineKind = Literal["auto", "fast", "materialized"]


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters a step sets ``.grad`` for, in ``model.parameters()`` order."""
    return [p for p in model.parameters() if p.requires_grad]


def global_norm(tensors: list[Tensor]) -> Tensor:
    """The L2 norm of ``tensors`` taken together as one vector."""
    return torch.stack([t.square().sum() for t in tensors]).sum().sqrt()


def _per_sample_losses(losses: Tensor, batch_size: int) -> Tensor:
    if losses.shape != (batch_size,):
        raise ValueError(
            f"loss_fn must return one loss per sample (reduction='none'): expected shape "
            f"({batch_size},), got {tuple(losses.shape)}"
        )
    return losses


class PerSampleGradients(ABC):
    """Computes per-sample gradient norms, then ``sum_i w_i g_i`` for any weights ``w``.

    ``compute`` must be called before ``weighted_grad``; ``losses`` then holds the detached
    per-sample losses of the batch (not private: for monitoring only).
    """

    losses: Tensor

    @abstractmethod
    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        """Per-sample gradient norms ``|g_i|``, shape ``(B,)``.

        ``groups`` is only read by gradient formers whose ``g_i`` depends on group ids (FairLens).
        """

    @abstractmethod
    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        """``sum_i w_i g_i`` for every trainable parameter; samples with ``w_i = 0`` are skipped."""

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        """Adds ``sum_i w_i g_i`` in place to ``into`` (one contiguous tensor per trainable
        parameter): the step adds the update to its freshly drawn noise this way."""
        for out, grad in zip(into, self.weighted_grad(weights), strict=True):
            out.add_(grad)

    def observe(self, private_grad: list[Tensor]) -> None:  # noqa: B027 - optional hook
        """Told each step's released (noised) gradient; only DP-SAT's former uses it."""


# --------------------------------------------------------------------------- fast path


class GhostClipping(PerSampleGradients):
    """Fast path for models whose trainable parameters all live in Linear and Conv2d layers
    (ghost norms) or LayerNorm and GroupNorm layers (materialised, they are small).

    A layer called several times in one forward (weight sharing) is handled by concatenating
    its calls along the position axis, which is exact since the per-sample gradient is a sum
    over positions.

    Args:
        clone_outputs: copy each layer output before handing it on, for models that modify
            layer outputs in place (``ReLU(inplace=True)``), which would otherwise change the
            tensor whose gradient is taken. ``make_engine`` sets it when it sees such a module.
    """

    def __init__(self, clone_outputs: bool = False) -> None:
        self.clone_outputs = clone_outputs
        self._layers: list[LayerGrads] = []
        self._params: list[nn.Parameter] = []
        self._all_finite = True

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        self._params = trainable_parameters(model)
        layers = [
            m
            for m in model.modules()
            if isinstance(m, FAST_LAYERS) and any(p.requires_grad for p in m.parameters(False))
        ]
        calls: list[tuple[nn.Module, Tensor, Tensor, int]] = []

        def capture(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
            calls.append((module, args[0].detach(), output, output._version))
            return output.clone() if self.clone_outputs else output

        handles = [m.register_forward_hook(capture) for m in layers]
        try:
            outputs = model(x)
        finally:
            for h in handles:
                h.remove()
        losses = _per_sample_losses(loss_fn(outputs, y), x.shape[0])
        self.losses = losses.detach()
        grads = torch.autograd.grad(losses.sum(), [c[2] for c in calls], allow_unused=True)
        per_layer: dict[nn.Module, list[tuple[Tensor, Tensor]]] = {}
        for (module, inp, out, version), grad in zip(calls, grads, strict=True):
            if out._version != version:
                raise RuntimeError(
                    f"the output of {module} was modified in place after the layer ran; "
                    "use GhostClipping(clone_outputs=True) or an out-of-place activation"
                )
            per_layer.setdefault(module, []).append(
                (inp, torch.zeros_like(out) if grad is None else grad)
            )
        self._layers = [layer_grads(m, c) for m, c in per_layer.items()]
        norms = sum((layer.sq_norms() for layer in self._layers), self._params[0].new_zeros(len(x)))
        norms = norms.sqrt()
        # A finite norm means finite factors, and 0 * finite = 0: masking is only needed otherwise.
        self._all_finite = bool(torch.isfinite(norms).all())
        return norms

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        summed = [torch.zeros_like(p) for p in self._params]
        self.add_weighted_grad(weights, summed)
        return summed

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        keep = None if self._all_finite else weights != 0
        targets = dict(zip(self._params, into, strict=True))
        for layer in self._layers:
            layer.add_weighted(weights, keep, targets)


# --------------------------------------------------------------------- materialised path

PerSampleFn = Callable[[dict[str, Tensor], Tensor, Tensor], tuple[dict[str, Tensor], Tensor]]


class Materialized(PerSampleGradients):
    """Reference path: every per-sample gradient by ``vmap(grad(loss of one sample))``.

    Subclasses change how ``g_i`` is formed by overriding :meth:`per_sample_fn` (BAM).
    """

    def __init__(self) -> None:
        self._grads: list[Tensor] = []

    def per_sample_fn(self, grad_value: PerSampleFn) -> PerSampleFn:
        """Maps (trainable params, x_i, y_i) to (g_i, loss_i); the default is ``grad_value``."""
        return grad_value

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
        fixed = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
        fixed.update(dict(model.named_buffers()))

        def loss_one(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
            out = functional_call(model, (p, fixed), (xi.unsqueeze(0),))
            return loss_fn(out, yi.unsqueeze(0)).sum()

        fn = self.per_sample_fn(grad_and_value(loss_one))
        grads, losses = vmap(fn, in_dims=(None, 0, 0), randomness="different")(params, x, y)
        self.losses = _per_sample_losses(losses, x.shape[0]).detach()
        self._grads = [grads[n] for n in names]
        return torch.stack([g.flatten(1).square().sum(1) for g in self._grads]).sum(0).sqrt()

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        keep = weights != 0
        return [torch.tensordot(weights.to(g.dtype), mask_rows(g, keep), 1) for g in self._grads]


# ------------------------------------------------------------------------------ factory


def fast_path_obstacle(model: nn.Module) -> str | None:
    """Why the fast path cannot serve ``model``, or ``None`` when it can."""
    seen: set[nn.Parameter] = set()
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if not isinstance(module, FAST_LAYERS):
            return f"{name or 'model'} ({type(module).__name__}) has trainable parameters"
        if seen.intersection(own):
            return f"{name} shares a parameter with another module"
        seen.update(own)
    return None


@functools.cache
def _log_fallback(reason: str) -> None:
    log.info("per-sample gradients: materialised path, because %s", reason)


def make_engine(model: nn.Module, kind: EngineKind = "auto") -> PerSampleGradients:
    """The per-sample gradient engine for ``model``.

    ``"auto"`` takes the fast path when every trainable parameter lives in a Linear, Conv2d,
    LayerNorm or GroupNorm layer, else the materialised path (each distinct reason is logged
    once).
    ``"fast"`` raises when the fast path cannot serve the model.
    """
    if kind not in ("auto", "fast", "materialized"):
        raise ValueError(f"engine must be 'auto', 'fast' or 'materialized', got {kind!r}")
    if kind == "materialized":
        return Materialized()
    reason = fast_path_obstacle(model)
    if reason is None:
        inplace = any(getattr(m, "inplace", False) for m in model.modules())
        return GhostClipping(clone_outputs=inplace)
    if kind == "fast":
        raise ValueError(f"the fast per-sample gradient path cannot serve this model: {reason}")
    _log_fallback(reason)
    return Materialized()
