"""Which former serves each layer on the fast path of :mod:`dpfair.engine.gradients`.

A layer's per-sample gradient is ``sum_t d_t a_t^T`` (``a`` its input, ``d`` its output
gradient, ``t`` over positions or convolution taps). :func:`layer_grads` picks, per layer, the
cheapest exact way to get its squared norms and its share of ``sum_i w_i g_i`` (the mixed ghost
clipping rule of Bu et al., ICML 2023, Sec. 3): the ghost norm ``|a|^2 |d|^2`` of a Linear
applied once per sample (:class:`DenseGrads`), the ``T x T`` Gram trick or the materialised
per-sample gradient (:class:`SequenceGrads`; both in :mod:`dpfair.engine.linear_grads`), a
convolution's per-sample weight by kernel taps (:mod:`dpfair.engine.conv_grads`), an
embedding's sparse row scatter (:mod:`dpfair.engine.embedding_grads`), or the small
LayerNorm/GroupNorm parameters materialised (:mod:`dpfair.engine.per_sample_layer`).
Materialised per-sample gradients (and im2col patches) live only while a layer's norms are
formed, in chunks of samples sized to the memory budget
(:func:`dpfair.engine.factors.engine_budget`), by the route of least estimated time
(:func:`dpfair.engine.factors.cheapest`: flops, memory traffic and kernel launches). The
weighted sum is one contraction of the kept factors, or, for a convolution whose per-sample
gradients were materialised and fit the budget, their weighted sum (:func:`model_layer_grads`'s
``room``). :func:`dpfair.engine.factors.balance_factors` keeps factors in range by exact powers
of two (the engine's "Overflow"); :func:`model_layer_grads` checks all weight factors of a
model at once, and per layer only when that fails. Other layers: one layer at a time by
:mod:`dpfair.engine.layer_fallback` (:func:`materialise_reason` says which and why)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from dpfair.engine.conv_grads import ConvGrads
from dpfair.engine.embedding_grads import EmbeddingGrads
from dpfair.engine.factors import (
    all_normal,
    cat_parts,
    engine_budget,
    row_norms,
    row_sq_norms,
    same_dtype,
)
from dpfair.engine.linear_grads import DenseGrads, SequenceGrads, layer_factors
from dpfair.engine.per_sample_layer import PerSampleLayer, norm_layer_grads

#: The layer kinds' gradient formers live in their own modules; this one chooses between them.
__all__ = [
    "FAST_LAYERS", "GHOST_LAYERS", "PER_SAMPLE_LAYERS", "ConvGrads", "DenseGrads",
    "EmbeddingGrads", "LayerGrads", "PerSampleLayer", "SequenceGrads", "all_normal",
    "check_weight_factors", "layer_factors", "layer_grads", "materialise_reason",
    "model_layer_grads", "norm_layer_grads", "tap_layer_grads",
]

#: Layers whose norms come from their factors; small layers materialised from the same tensors.
GHOST_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
PER_SAMPLE_LAYERS: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.GroupNorm)
FAST_LAYERS = GHOST_LAYERS + PER_SAMPLE_LAYERS + (nn.Embedding,)


def materialise_reason(module: nn.Module) -> str | None:
    """``None`` when the fast path handles this leaf module's own parameters (or it has none),
    else why its per-sample gradients are materialised, layer by layer."""
    name = f"nn.{type(module).__name__}" if type(module).__module__.startswith("torch.nn") else (
        type(module).__qualname__
    )
    if not any(p.requires_grad for p in module.parameters(recurse=False)):
        return None
    if isinstance(module, nn.Embedding):
        if module.scale_grad_by_freq:
            return f"{name}: scale_grad_by_freq scales by token counts (vmap of the layer)"
        if module.max_norm is not None:
            return f"{name}: max_norm renormalises the weight inside the forward (vmap)"
        return None
    if isinstance(module, FAST_LAYERS):
        return None
    return f"{name}: no ghost-norm rule for this layer type; its per-sample gradients are " \
        "materialised by vmap of the layer alone"


def _is_dense(module: nn.Module, calls: list[tuple[Tensor, Tensor]]) -> bool:
    """A Linear called once on ``(B, d_in)`` inputs (:class:`DenseGrads`)."""
    return len(calls) == 1 and isinstance(module, nn.Linear) and calls[0][0].dim() == 2


def _balanced_weight(module: nn.Module) -> bool:
    """Whether the layer keeps balanced weight factors (a trainable Linear or Conv2d weight)."""
    return isinstance(module, GHOST_LAYERS) and module.weight.requires_grad


#: Per dense layer its factors' squared norms (``None`` for a frozen weight's input), and whether
#: all weight factors' squared norms are normal numbers (``None``: nothing to check).
FactorCheck = tuple[dict[nn.Module, tuple[Tensor | None, Tensor]], bool | None]


def check_weight_factors(per_layer: dict[nn.Module, list[tuple[Tensor, Tensor]]]) -> FactorCheck:
    """One overflow check (:func:`all_normal`) for the weight factors of all Linear and Conv2d
    layers together: when it passes, none of them needs :func:`balance_factors`'s rescaling."""
    dense: dict[nn.Module, tuple[Tensor | None, Tensor]] = {}
    checked: list[Tensor] = []
    norms: list[Tensor] = []  # of the other layers' factors: one square for all of them
    for module, calls in per_layer.items():
        if _is_dense(module, calls):
            a, d = calls[0]
            dense[module] = (row_sq_norms(a) if module.weight.requires_grad else None,
                             row_sq_norms(d))
            checked += dense[module] if module.weight.requires_grad else []  # type: ignore[arg-type]
        elif _balanced_weight(module):
            norms += [row_norms(t) for call in calls for t in call]
    if norms:
        checked += [cat_parts(norms).square()] if same_dtype(norms) else [n.square() for n in norms]
    return dense, all_normal(checked) if checked else None


def model_layer_grads(
    per_layer: dict[nn.Module, list[tuple[Tensor, Tensor]]], budget: int | None = None,
    check: FactorCheck | None = None, keep: bool = False, room: int = 0,
) -> list[LayerGrads]:
    """:func:`layer_grads` of every layer, in order, after one overflow check for all of them
    (``check``, :func:`check_weight_factors` if not given): where it fails, each layer makes its
    own check. ``budget``: bytes of per-sample intermediates per layer (default
    :func:`engine_budget` of the factors' device); ``keep``: convolutions keep the per-sample
    kernels their norms form (:class:`ConvGrads`); ``room``: bytes of such kernels the
    convolutions whose route materialises them may keep for the weighted sum, in layer order
    (:meth:`ConvGrads.keep_for_sum`)."""
    dense, normal = check_weight_factors(per_layer) if check is None else check
    if budget is None and per_layer:
        budget = engine_budget(next(iter(per_layer.values()))[0][1].device)
    layers: list[LayerGrads] = []
    for module, calls in per_layer.items():
        if module in dense:
            layers.append(DenseGrads(module, *calls[0], dense[module], normal or None))  # type: ignore[arg-type]
            continue
        layer = layer_grads(module, calls, budget, normal or None, keep)
        if isinstance(layer, ConvGrads):
            room -= layer.keep_for_sum(room)
        layers.append(layer)
    return layers


def layer_grads(
    module: nn.Module, calls: list[tuple[Tensor, Tensor]], budget: int | None = None,
    normal: bool | None = None, keep: bool = False,
) -> LayerGrads:
    """One layer's per-sample gradients from its (input, output gradient) per call.
    ``budget``: as for :func:`model_layer_grads`; ``normal``: whether its factors' squared norms
    are known to be normal numbers (``None``: check them here)."""
    if budget is None:
        budget = engine_budget(calls[0][1].device)
    if isinstance(module, nn.Embedding):
        return EmbeddingGrads(module, calls)
    if isinstance(module, nn.Conv2d):
        return ConvGrads(module, calls, budget, normal, keep)
    if isinstance(module, GHOST_LAYERS):
        if _is_dense(module, calls):
            return DenseGrads(module, *calls[0], normal=normal)
        factors = [layer_factors(module, inp, grad) for inp, grad in calls]
        if len(factors) == 1:
            return SequenceGrads(module, *factors[0], budget, normal)
        a, d = (torch.cat(t, 1) for t in zip(*factors, strict=True))  # calls are positions
        return SequenceGrads(module, a, d, budget, normal)
    per_call = [norm_layer_grads(module, inp, grad) for inp, grad in calls]
    flat = functools.reduce(torch.add, [c.flat for c in per_call])
    return PerSampleLayer(per_call[0].params, flat)


#: What :func:`layer_grads` returns for one layer.
LayerGrads = DenseGrads | SequenceGrads | ConvGrads | EmbeddingGrads | PerSampleLayer


def tap_layer_grads(module: nn.Module, a: Tensor, d: Tensor, budget: int) -> tuple:
    """A layer called once, from its raw factors (no rescaling): its :data:`LayerGrads`, and
    the norm parts (:data:`dpfair.engine.factors.NormParts`) of its weight factors, whose
    squares (of the norms) and entries (of the squares) must all be normal numbers
    (:func:`all_normal`) for its norms to be exact (:func:`balance_factors`)."""
    calls = [(a, d)]
    if _is_dense(module, calls):
        trained = module.weight.requires_grad
        squares = (row_sq_norms(a) if trained else None, row_sq_norms(d))
        layer = DenseGrads(module, a, d, squares, normal=True)  # type: ignore[arg-type]
        return layer, ([], list(squares) if trained else [])  # type: ignore[arg-type]
    checked = [row_norms(a), row_norms(d)] if _balanced_weight(module) else []
    return layer_grads(module, calls, budget, normal=True), (checked, [])
