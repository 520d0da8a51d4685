"""One layer's per-sample gradient factors for the fast path of :mod:`dpfair.engine.gradients`.

A layer's per-sample gradient is ``sum_t d_t a_t^T`` (``a`` its input, ``d`` its output
gradient, ``t`` over positions or convolution taps). :func:`layer_grads` picks, per layer, the
cheapest exact way to get its squared norms and its share of ``sum_i w_i g_i`` (the mixed ghost
clipping rule of Bu et al., ICML 2023, Sec. 3): the ghost norm ``|a|^2 |d|^2`` of a Linear
applied once per sample (:class:`DenseGrads`), the ``T x T`` Gram trick or the materialised
per-sample gradient (:class:`SequenceGrads`), a convolution's per-sample weight by kernel taps
(:class:`ConvGrads`), an embedding's sparse row scatter (:class:`EmbeddingGrads`), or the small
LayerNorm/GroupNorm parameters materialised (:class:`PerSampleLayer`). Materialised per-sample
gradients (and im2col patches) live only while a layer's norms are formed, in chunks of samples
sized to the memory budget (:func:`engine_budget`), by the route of least estimated time
(:func:`cheapest`: flops, memory traffic and kernel launches). The weighted sum is one
contraction of the kept factors. :func:`balance_factors` keeps factors in range by exact powers
of two (the engine's "Overflow"); :func:`model_layer_grads` checks all weight factors of a
model at once, and per layer only when that fails. Other layers: one layer at a time by
:mod:`dpfair.engine.layer_fallback` (:func:`materialise_reason` says which and why).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpfair.engine.conv_factors import conv_patches
from dpfair.engine.conv_grads import ConvGrads
from dpfair.engine.factors import (
    NormParts,
    all_normal,
    balance_factors,
    balanced,
    cat_parts,
    chunks,
    engine_budget,
    factor_norm_parts,
    gram_route,
    in_dtype,
    mask_rows,
    row_norms,
    row_sq_norms,
    same_dtype,
    square_sum,
)

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


class DenseGrads:
    """A layer applied once to each sample (a Linear on ``(B, d_in)`` inputs): its per-sample
    gradient is ``g_i = d_i a_i^T`` (and ``d_i`` for the bias), so
    ``|g_i|^2 = |d_i|^2 |a_i|^2 + |d_i|^2`` (the ghost norm) and ``sum_i w_i g_i = (w d)^T a``,
    from the weight's factors after :func:`balance_factors`."""

    __slots__ = ("weight", "bias", "d", "a_w", "d_w", "sq")

    def __init__(
        self, module: nn.Linear, a: Tensor, d: Tensor,
        squares: tuple[Tensor | None, Tensor] | None = None, normal: bool | None = None,
    ) -> None:
        """``squares``: ``(|a_i|^2, |d_i|^2)`` if formed (``|a_i|^2`` for a trainable weight);
        ``normal``: whether they are all normal numbers, ``None``: check here."""
        self.weight = module.weight if module.weight.requires_grad else None
        self.bias = module.bias if module.bias is not None and module.bias.requires_grad else None
        sq_a, sq_d = squares if squares is not None else (None, row_sq_norms(d))
        self.d = d  # the bias gradient
        self.a_w, self.d_w = a, d  # the weight's factors
        self.sq = sq_d if self.bias is not None else d.new_zeros(len(d))
        if self.weight is not None:
            sq_a = row_sq_norms(a) if sq_a is None else sq_a
            self.a_w, self.d_w, sq_a_w, sq_d_w = balance_factors(a, d, sq_a, sq_d, normal)
            self.sq = self.sq + sq_d_w * sq_a_w

    def norm_parts(self) -> NormParts:
        return [], [self.sq]

    def sq_norms(self) -> Tensor:
        return self.sq

    def add_weighted(
        self, weights: Tensor, keep: Tensor | None, into: dict[nn.Parameter, Tensor]
    ) -> None:
        """Adds ``sum_i w_i g_i`` to ``into``; rows outside ``keep`` are zeroed first (``None``:
        all finite). The weights scale the narrower factor, ``a`` or ``d``."""
        w = in_dtype(weights, self.d.dtype)
        if self.weight is not None:
            a, d = mask_rows(self.a_w, keep), mask_rows(self.d_w, keep)
            out = into[self.weight]  # (d_out, d_in), shaped like the weight
            if d.shape[1] <= a.shape[1]:
                out.addmm_((d * w.unsqueeze(1)).T, a)
            else:
                out.addmm_(d.T, a * w.unsqueeze(1))
        if self.bias is not None:
            into[self.bias].addmv_(mask_rows(self.d, keep).T, w)


class SequenceGrads:
    """A Linear layer on inputs with extra dimensions ``(B, T, d)``, or called several times:
    its per-sample gradient in factored form ``g_i = sum_t d[i,t]^T a[i,t]``.

    ``a``: ``(B, T, 1, d_in)``, ``d``: ``(B, T, 1, d_out)`` (:func:`layer_factors`'s layout). The
    weight's factors are kept (balanced, :func:`balance_factors`); its squared norms come from
    the Gram trick or from per-sample gradients materialised a chunk of samples at a time,
    whichever :func:`gram_route` expects faster, and the weighted sum is one contraction of the
    factors.
    """

    def __init__(
        self, module: nn.Linear, a: Tensor, d: Tensor, budget: int, normal: bool | None = None
    ) -> None:
        self.module, self.batch_size, self.budget = module, a.shape[0], budget
        has_bias = module.bias is not None and module.bias.requires_grad
        self.bias_grad = d.sum(1) if has_bias else None  # sum_t d_t, (B, G, d_out)
        self.a: Tensor | None = None  # the weight's balanced factors
        self.d: Tensor | None = None
        _, t, _, d_in = a.shape
        self.gram = gram_route(
            len(a), t, d_in, d.shape[-1], a.element_size(), a.device, budget
        )
        if module.weight.requires_grad:
            self.a, self.d, _, _ = balanced(a, d, normal)

    def norm_parts(self) -> NormParts:
        norms = [] if self.bias_grad is None else [row_norms(self.bias_grad)]
        squares: list[Tensor] = []
        if self.a is not None and self.d is not None:
            a, d = self.a, self.d
            t, g, d_in, d_out = a.shape[1], a.shape[2], a.shape[3], d.shape[3]
            held = 3 * t * t if self.gram else g * d_in * d_out
            slices = chunks(self.batch_size, held * a.element_size(), self.budget)
            a, d = a.permute(0, 2, 3, 1), d.permute(0, 2, 3, 1)  # (B, G, d, T)
            parts = [factor_norm_parts(a[c], d[c], self.gram) for c in slices]
            (squares if self.gram else norms).append(
                cat_parts([p[1][0] if self.gram else p[0][0] for p in parts]))
        return norms, squares

    def sq_norms(self) -> Tensor:
        return square_sum(self.norm_parts())

    def add_weighted(
        self, weights: Tensor, keep: Tensor | None, into: dict[nn.Parameter, Tensor]
    ) -> None:
        """Adds ``sum_i w_i g_i`` to ``into``; rows outside ``keep`` are zeroed first (``None``:
        all finite)."""
        m, w = self.module, in_dtype(weights, self.module.weight.dtype)
        b = len(weights)
        if self.a is not None and self.d is not None:
            a, d = mask_rows(self.a, keep), mask_rows(self.d, keep)
            d_in, d_out = a.shape[-1], d.shape[-1]
            dw = d * w.view(-1, 1, 1, 1)  # one (B T, d_out)^T @ (B T, d_in) matmul
            into[m.weight].addmm_(dw.reshape(-1, d_out).T, a.reshape(-1, d_in))
        if self.bias_grad is not None:
            bias_grad = mask_rows(self.bias_grad, keep).reshape(b, -1)
            into[m.bias].view(-1).addmv_(bias_grad.T, w)  # type: ignore[union-attr]


class EmbeddingGrads:
    """An embedding's per-sample gradient is a sparse row scatter,
    ``g_i = sum_t e_{id_t} d_t^T``, so ``|g_i|^2 = sum_{t, s: id_t = id_s} <d_t, d_s>``: the
    output gradients are summed per (sample, token id) and the row sums squared -- ``B T d``
    flops after one sort, never the ``V x d`` matrix per sample. The weighted sum is one
    ``index_add_`` of the ``w``-scaled output gradients. Positions holding ``padding_idx`` have
    no gradient (as in ``F.embedding``'s backward)."""

    def __init__(self, module: nn.Embedding, calls: list[tuple[Tensor, Tensor]]) -> None:
        self.module, b, dim = module, calls[0][0].shape[0], module.embedding_dim
        self.ids = torch.cat([ids.reshape(b, -1) for ids, _ in calls], 1)
        d = torch.cat([grad.reshape(b, -1, dim) for _, grad in calls], 1)
        if module.padding_idx is not None:
            d = torch.where((self.ids == module.padding_idx).unsqueeze(-1), 0, d)
        self.d = d

    def norm_parts(self) -> NormParts:
        return [], [self.sq_norms()]

    def sq_norms(self) -> Tensor:
        b, t = self.ids.shape
        v = self.module.num_embeddings
        keys = (torch.arange(b, device=self.ids.device).unsqueeze(1) * v + self.ids).flatten()
        unique, inverse = torch.unique(keys, return_inverse=True)
        rows = self.d.new_zeros(len(unique), self.d.shape[-1])
        rows.index_add_(0, inverse, self.d.reshape(b * t, -1))
        return self.d.new_zeros(b).index_add_(0, unique // v, row_sq_norms(rows))

    def add_weighted(
        self, weights: Tensor, keep: Tensor | None, into: dict[nn.Parameter, Tensor]
    ) -> None:
        """Adds ``sum_i w_i g_i`` to ``into``; rows outside ``keep`` are zeroed first."""
        dw = mask_rows(self.d, keep) * in_dtype(weights, self.d.dtype).view(-1, 1, 1)
        into[self.module.weight].index_add_(0, self.ids.flatten(), dw.reshape(-1, dw.shape[-1]))


def layer_factors(module: nn.Module, inp: Tensor, grad_out: Tensor) -> tuple[Tensor, Tensor]:
    """Layer input and output gradient as ``a: (B, T, G, d_in)``, ``d: (B, T, G, d_out)``
    (for a convolution ``a`` holds its im2col patches, :func:`conv_patches`)."""
    b = inp.shape[0]
    if isinstance(module, nn.Linear):
        return inp.reshape(b, -1, 1, inp.shape[-1]), grad_out.reshape(b, -1, 1, grad_out.shape[-1])
    assert isinstance(module, nn.Conv2d)
    a = conv_patches(module, inp)
    d = grad_out.reshape(*a.shape[:2], -1, a.shape[-1])
    return a.permute(0, 3, 1, 2), d.permute(0, 3, 1, 2)


class PerSampleLayer:
    """A small layer's materialised per-sample gradients: one ``(B, N)`` matrix whose columns
    run over its trainable ``params`` in order, each flattened."""

    def __init__(self, params: list[nn.Parameter], flat: Tensor) -> None:
        self.params, self.flat = params, flat

    @classmethod
    def of(cls, grads: dict[nn.Parameter, Tensor]) -> PerSampleLayer:
        """From per-parameter per-sample gradients ``{param: (B, *shape)}``."""
        flat = [g.reshape(len(g), -1) for g in grads.values()]
        return cls(list(grads), cat_parts(flat, 1))

    @property
    def grads(self) -> dict[nn.Parameter, Tensor]:
        """``{param: (B, *shape)}``, views of the matrix."""
        parts = self.flat.split([p.numel() for p in self.params], 1)
        return {p: g.view(-1, *p.shape) for p, g in zip(self.params, parts, strict=True)}

    def norm_parts(self) -> NormParts:
        return [row_norms(self.flat)], []

    def sq_norms(self) -> Tensor:
        return row_sq_norms(self.flat)

    def add_weighted(
        self, weights: Tensor, keep: Tensor | None, into: dict[nn.Parameter, Tensor]
    ) -> None:
        """Adds ``sum_i w_i g_i``: one matrix-vector product where the targets lie side by side
        in one buffer (the step's noise), else one per parameter."""
        per_sample, w = mask_rows(self.flat, keep), in_dtype(weights, self.flat.dtype)
        joint = _joint_view([into[p] for p in self.params], self.flat.dtype)
        if joint is not None:
            joint.addmv_(per_sample.T, w)
            return
        parts = per_sample.split([p.numel() for p in self.params], 1)
        for p, g in zip(self.params, parts, strict=True):
            into[p].view(-1).addmv_(g.T, w)


def _joint_view(targets: list[Tensor], dtype: torch.dtype) -> Tensor | None:
    """One flat view over ``targets`` where they are contiguous tensors of ``dtype`` laid out
    one after the other in one storage, else ``None``."""
    first = targets[0]
    offset = first.storage_offset()
    for t in targets:
        if not t.is_contiguous() or t.dtype != dtype or t.storage_offset() != offset or (
            t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
        ):
            return None
        offset += t.numel()
    return first.as_strided((offset - first.storage_offset(),), (1,))


def norm_layer_grads(
    module: nn.LayerNorm | nn.GroupNorm, inp: Tensor, grad_out: Tensor
) -> PerSampleLayer:
    """Per-sample gradients of a LayerNorm's or GroupNorm's affine parameters (weight, then
    bias): ``sum x_hat d`` and ``sum d`` over the positions, ``x_hat`` the input normalised
    without the affine part, formed together in one reduction."""
    b = inp.shape[0]
    if isinstance(module, nn.LayerNorm):
        normalised = F.layer_norm(inp, module.normalized_shape, eps=module.eps)
        axis = inp.dim() - len(module.normalized_shape)  # the affine part's first axis
    else:
        normalised = F.group_norm(inp, module.num_groups, eps=module.eps)
        axis = 1
    params, parts = [], []
    if module.weight is not None and module.weight.requires_grad:
        params.append(module.weight)
        parts.append(normalised * grad_out)
    if module.bias is not None and module.bias.requires_grad:
        params.append(module.bias)
        parts.append(grad_out)
    joint = parts[0] if len(parts) == 1 else torch.cat(parts, axis)
    if isinstance(module, nn.LayerNorm):  # sum over the positions before the affine axes
        flat = joint.reshape(b, math.prod(joint.shape[1:axis]), -1).sum(1)
    else:  # sum over the positions after the channels
        flat = joint.reshape(b, joint.shape[1], -1).sum(2)
    return PerSampleLayer(params, flat)


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
    check: FactorCheck | None = None, keep: bool = False,
) -> list[LayerGrads]:
    """:func:`layer_grads` of every layer, in order, after one overflow check for all of them
    (``check``, :func:`check_weight_factors` if not given): where it fails, each layer makes its
    own check. ``budget``: bytes of per-sample intermediates per layer (default
    :func:`engine_budget` of the factors' device); ``keep``: convolutions keep the per-sample
    kernels their norms form (:class:`ConvGrads`)."""
    dense, normal = check_weight_factors(per_layer) if check is None else check
    if budget is None and per_layer:
        budget = engine_budget(next(iter(per_layer.values()))[0][1].device)
    return [
        DenseGrads(module, *calls[0], dense[module], normal or None)  # type: ignore[arg-type]
        if module in dense else layer_grads(module, calls, budget, normal or None, keep)
        for module, calls in per_layer.items()
    ]


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
