"""One layer's per-sample gradient factors for the fast path of :mod:`dpfair.privacy.gradients`.

A layer's per-sample gradient is ``sum_t d_t a_t^T`` (``a`` its input, ``d`` its output
gradient, ``t`` over positions or convolution taps). :func:`layer_grads` picks, per layer, the
cheapest exact way to get its squared norms and its share of ``sum_i w_i g_i`` (the mixed ghost
clipping rule of Bu et al., ICML 2023, "Differentially private optimization on large model at
small cost", Sec. 3: per layer, ghost norm or materialised, whichever has fewer flops): the
ghost norm ``|a|^2 |d|^2`` of a Linear applied once per sample (:class:`_DenseGrads`), the
``T x T`` Gram trick or the materialised per-sample gradient (:class:`_LayerGrads`), a
convolution's per-sample weight by kernel taps (:class:`_ConvGrads`), an embedding's sparse
row scatter (:class:`EmbeddingGrads`), or the small LayerNorm/GroupNorm parameters
materialised (:class:`PerSampleLayer`). Materialised per-sample gradients only live while a
layer's norms are formed (in chunks of samples, :data:`CHUNK_ELEMENTS`): the weighted sum is
one contraction of the kept factors. :func:`balance_factors` keeps factors whose squares over- or
underflow in range by exact powers of two (see the engine's module docstring, "Overflow");
:func:`model_layer_grads` makes that check once for all dense layers of a model (a small MLP's
step is dominated by such per-layer bookkeeping) and per layer only when it fails.
Layers not listed here get their per-sample gradients one layer at a time by
:mod:`dpfair.privacy.layer_fallback`; :func:`materialise_reason` says which and why.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Layers whose per-sample gradient norms the fast path computes without materialising them.
GHOST_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
#: Small layers the fast path materialises per sample, from the same input and output gradient.
PER_SAMPLE_LAYERS: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.GroupNorm)
FAST_LAYERS = GHOST_LAYERS + PER_SAMPLE_LAYERS + (nn.Embedding,)
#: At most this many elements of materialised per-sample gradients exist at once (per layer).
CHUNK_ELEMENTS = 1 << 24


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


def _chunks(batch: int, per_sample: int) -> list[slice]:
    """Slices of the batch holding at most :data:`CHUNK_ELEMENTS` elements of per-sample
    tensors of ``per_sample`` elements each (at least one sample)."""
    step = max(1, CHUNK_ELEMENTS // max(per_sample, 1))
    return [slice(i, min(i + step, batch)) for i in range(0, batch, step)]


def mask_rows(t: Tensor, keep: Tensor | None) -> Tensor:
    """Zero the rows outside ``keep``, so that a non-finite sample cannot turn a sum into NaN."""
    return t if keep is None else torch.where(keep.view(-1, *([1] * (t.dim() - 1))), t, 0)


class _DenseGrads:
    """A layer applied once to each sample (a Linear on ``(B, d_in)`` inputs): its per-sample
    gradient is ``g_i = d_i a_i^T`` (and ``d_i`` for the bias), so
    ``|g_i|^2 = |d_i|^2 |a_i|^2 + |d_i|^2`` (the ghost norm) and ``sum_i w_i g_i = (w d)^T a``,
    from the weight's factors after :func:`balance_factors`."""

    __slots__ = ("weight", "bias", "d", "a_w", "d_w", "sq")

    def __init__(
        self, module: nn.Linear, a: Tensor, d: Tensor,
        squares: tuple[Tensor | None, Tensor] | None = None, normal: bool | None = None,
    ) -> None:
        """``squares``: ``(|a_i|^2, |d_i|^2)`` if already formed (``|a_i|^2`` only for a
        trainable weight); ``normal``: whether they are known to be all normal numbers
        (:func:`dense_layer_grads`), ``None``: check here."""
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


class _LayerGrads:
    """A Linear layer on inputs with extra dimensions ``(B, T, d)``, or called several times:
    its per-sample gradient in factored form ``g_i = sum_t d[i,t]^T a[i,t]``.

    ``a``: ``(B, T, 1, d_in)``, ``d``: ``(B, T, 1, d_out)`` (:func:`layer_factors`'s layout). The
    weight's factors are kept (balanced, :func:`balance_factors`); its squared
    norms come from the Gram trick or from per-sample gradients materialised a chunk of samples
    at a time, whichever is cheaper, and the weighted sum is one contraction of the factors.
    """

    def __init__(self, module: nn.Linear, a: Tensor, d: Tensor) -> None:
        self.module, self.batch_size = module, a.shape[0]
        has_bias = module.bias is not None and module.bias.requires_grad
        self.bias_grad = d.sum(1) if has_bias else None  # sum_t d_t, (B, G, d_out)
        self.a: Tensor | None = None
        self.d: Tensor | None = None
        self.gram = gram_is_cheaper(a.shape[1], a.shape[-1], d.shape[-1])
        if module.weight.requires_grad:
            self.a, self.d, _, _ = balance_factors(a, d, row_sq_norms(a), row_sq_norms(d))

    def sq_norms(self) -> Tensor:
        sq = self.module.weight.new_zeros(self.batch_size)
        if self.bias_grad is not None:
            sq = sq + row_sq_norms(self.bias_grad)
        if self.a is None or self.d is None:
            return sq
        if self.gram:  # B T^2 (d_in + d_out) flops
            aa = torch.einsum("btgi,bsgi->bgts", self.a, self.a)
            dd = torch.einsum("btgo,bsgo->bgts", self.d, self.d)
            return sq + (aa * dd).sum((1, 2, 3))
        _, _, g, d_in = self.a.shape  # materialise, a chunk at a time: B T d_in d_out flops
        parts = [
            row_sq_norms(torch.einsum("btgo,btgi->bgoi", self.d[c], self.a[c]))
            for c in _chunks(self.batch_size, g * d_in * self.d.shape[-1])
        ]
        return sq + torch.cat(parts)

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


class _ConvGrads:
    """A convolution keeps only its (balanced) inputs and output gradients. Its squared norms
    come, a chunk of samples at a time, from the per-sample weight gradients (one batched
    matmul per kernel tap, :func:`_conv_tap_grads`) or, where there are few positions, from
    the Gram trick over im2col patches (:func:`layer_factors`), whichever is cheaper; neither the
    per-sample gradients nor the patches outlive their chunk. The weighted sum is one
    convolution weight-gradient of the ``w``-scaled output gradients
    (``torch.nn.grad.conv2d_weight``)."""

    def __init__(self, module: nn.Conv2d, calls: list[tuple[Tensor, Tensor]]) -> None:
        self.module, self.batch_size = module, calls[0][0].shape[0]
        self.calls: list[tuple[Tensor, Tensor]] = []
        self.gram = not _conv_materialises(module, calls[0][1])
        self.bias_grad = None
        if module.bias is not None and module.bias.requires_grad:
            self.bias_grad = sum(grad.sum((2, 3)) for _, grad in calls)
        if module.weight.requires_grad:
            for inp, grad in calls:
                a, d, _, _ = balance_factors(inp, grad, row_sq_norms(inp), row_sq_norms(grad))
                self.calls.append((a, d))

    def _chunk_sq(self, c: slice) -> Tensor:
        m = self.module
        if self.gram:
            factors = [layer_factors(m, a[c], d[c]) for a, d in self.calls]
            a, d = (torch.cat(t, 1) for t in zip(*factors, strict=True))  # calls are positions
            aa = torch.einsum("btgi,bsgi->bgts", a, a)
            dd = torch.einsum("btgo,bsgo->bgts", d, d)
            return (aa * dd).sum((1, 2, 3))
        taps = sum(_conv_tap_grads(m, padded_input(m, a[c]), d[c]) for a, d in self.calls)
        return torch.linalg.vector_norm(taps, dim=(0, 2)).square()  # type: ignore[arg-type]

    def sq_norms(self) -> Tensor:
        w = self.module.weight
        sq = w.new_zeros(self.batch_size)
        if self.bias_grad is not None:
            sq = sq + row_sq_norms(self.bias_grad)  # type: ignore[arg-type]
        if not self.calls:
            return sq
        a, d = self.calls[0]
        positions = len(self.calls) * d.shape[-1] * d.shape[-2]
        per_sample = (
            positions * (a.shape[1] * w.shape[-1] * w.shape[-2] + positions)
            if self.gram else 2 * w.numel()
        )
        return sq + torch.cat([self._chunk_sq(c) for c in _chunks(self.batch_size, per_sample)])

    def add_weighted(
        self, weights: Tensor, keep: Tensor | None, into: dict[nn.Parameter, Tensor]
    ) -> None:
        """Adds ``sum_i w_i g_i`` to ``into``; rows outside ``keep`` are zeroed first."""
        m, w = self.module, in_dtype(weights, self.module.weight.dtype)
        for a, d in self.calls:
            dw = mask_rows(d, keep) * w.view(-1, 1, 1, 1)
            into[m.weight].add_(torch.nn.grad.conv2d_weight(
                padded_input(m, mask_rows(a, keep)), m.weight.shape, dw,
                stride=m.stride, padding=0, dilation=m.dilation, groups=m.groups,
            ))
        if self.bias_grad is not None:
            bias = into[m.bias]  # type: ignore[index]
            bias.addmv_(mask_rows(self.bias_grad, keep).T, w)  # type: ignore[arg-type]


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


def gram_is_cheaper(t: int, d_in: int, d_out: int) -> bool:
    """Gram trick (``B T^2 (d_in + d_out)`` flops) vs materialising (``B T d_in d_out``)."""
    return t * (d_in + d_out) < d_in * d_out


def row_sq_norms(t: Tensor) -> Tensor:
    """Per-sample squared norm over all but the batch axis."""
    flat = t if t.dim() == 2 else t.reshape(t.shape[0], -1)
    return torch.linalg.vecdot(flat, flat)


def in_dtype(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype`` (no call at all where it is already)."""
    return t if t.dtype == dtype else t.to(dtype)


@functools.cache
def _powers_of_two(dtype: torch.dtype, device: torch.device) -> tuple[Tensor, int]:
    """``2^j`` for ``j = -lim .. lim``, exact in ``dtype`` (``2^lim``: its largest power of 2)."""
    lim = math.frexp(torch.finfo(dtype).max)[1] - 1
    powers = [math.ldexp(1.0, j) for j in range(-lim, lim + 1)]
    return torch.tensor(powers, dtype=dtype, device=device), lim


def _exponents(t: Tensor) -> tuple[Tensor, Tensor]:
    """Per sample, the binary exponent ``e`` of the largest entry (``max |t_i|`` lies in
    ``[2^(e-1), 2^e)``) and whether the sample is all zero."""
    mantissa, exponent = torch.frexp(t.flatten(1).abs().amax(1))  # vector_norm(inf): slow on CPU
    return exponent, mantissa == 0


def all_normal(squares: list[Tensor]) -> bool:
    """Whether every entry of ``squares`` is a normal number of its dtype: neither zero,
    subnormal, infinite nor NaN. One reduction (NaN propagates through it) and one read, for
    any number of tensors of one dtype."""
    if any(sq.dtype != squares[0].dtype for sq in squares):
        return all(all_normal([sq]) for sq in squares)  # each in its own range
    flat = torch.cat(squares) if len(squares) > 1 else squares[0]
    if flat.numel() == 0:
        return True
    lo, hi = torch.stack(torch.aminmax(flat)).tolist()  # one device sync
    info = torch.finfo(flat.dtype)
    return info.tiny <= lo and hi <= info.max


def balance_factors(
    a: Tensor, d: Tensor, sq_a: Tensor, sq_d: Tensor, normal: bool | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(a, d, |a_i|^2, |d_i|^2)`` for the factors of per-sample gradients
    ``g_i = sum_t d_t a_t^T``, given their squared norms, rescaled where products could overflow.

    Unchanged when every ``|a_i|^2`` and ``|d_i|^2`` is a normal number (one check): their
    products then overflow or underflow only where ``|g_i|^2`` does. Otherwise (a huge input, a
    saturated or dead layer) ``(a_i 2^-k_i, d_i 2^k_i)`` for each sample, ``k_i`` half the gap
    between the binary exponents of the largest entries of ``a_i`` and ``d_i`` (a zero factor
    leaves the other scaled to about 1). ``g_i`` is unchanged (scaling by a power of two is
    exact) and both factors now have about the magnitude ``sqrt(max_jk |d_j a_k|)``: squared
    norms, Gram products and their products overflow or underflow only where ``|g_i|^2`` does,
    and the weighted sum's ``w_i a`` or ``w_i d`` stays near ``s / sqrt(|g_i|)`` for a weight
    ``w_i = s / |g_i|``. ``normal``: the outcome of that check if the caller made it
    already (:func:`all_normal` of ``sq_a`` and ``sq_d``, e.g. for several layers at once).
    """
    if normal is None:
        normal = all_normal([sq_a, sq_d])
    if normal:
        return a, d, sq_a, sq_d
    e_a, zero_a = _exponents(a)
    e_d, zero_d = _exponents(d)
    e_a = torch.where(zero_a, -e_d, e_a)
    e_d = torch.where(zero_d, -e_a, e_d)
    powers, lim = _powers_of_two(a.dtype, a.device)
    k = torch.div(e_a - e_d, 2, rounding_mode="floor").clamp_(-lim, lim)
    shape = (-1,) + (1,) * (a.dim() - 1)
    a, d = a * powers[lim - k].view(shape), d * powers[lim + k].view(shape)
    return a, d, row_sq_norms(a), row_sq_norms(d)


def layer_factors(module: nn.Module, inp: Tensor, grad_out: Tensor) -> tuple[Tensor, Tensor]:
    """Layer input and output gradient as ``a: (B, T, G, d_in)``, ``d: (B, T, G, d_out)``.

    For a convolution ``a`` holds the im2col patches, so only use this where the Gram trick
    wins (few positions); otherwise :func:`_conv_tap_grads` is cheaper.
    """
    b = inp.shape[0]
    if isinstance(module, nn.Linear):
        return inp.reshape(b, -1, 1, inp.shape[-1]), grad_out.reshape(b, -1, 1, grad_out.shape[-1])
    assert isinstance(module, nn.Conv2d)
    g = module.groups
    (kh, kw), (dh, dw), (sh, sw) = module.kernel_size, module.dilation, module.stride
    # im2col from strided views and one copy (aten's CPU im2col is far slower at these sizes):
    # (B, C, H_out, W_out, dh (kh - 1) + 1, dw (kw - 1) + 1), then every dilation-th tap.
    padded = padded_input(module, inp)
    patches = padded.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
    patches = patches[..., ::dh, ::dw]
    t = patches.shape[2] * patches.shape[3]
    a = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, t, g, -1)  # C-major, then kh, kw
    d = grad_out.reshape(b, g, -1, t).permute(0, 3, 1, 2)
    return a, d


def padded_input(module: nn.Conv2d, inp: Tensor) -> Tensor:
    """The input padded exactly as the module pads it ('same', non-zero padding modes)."""
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    return F.pad(inp, module._reversed_padding_repeated_twice, mode=mode)


def _conv_tap_grads(module: nn.Conv2d, padded: Tensor, grad_out: Tensor) -> Tensor:
    """Per-sample weight gradients of a convolution in tap-major layout
    ``(kh kw, B, G c_in c_out)``, one batched matmul per kernel tap:
    ``G_i[o, c, u, v] = sum_p d_i[o, p] x_i[c, p + (u, v)]`` (no im2col; only their norms are
    used, so the layout is the matmuls'). ``padded``: the input padded as the module pads it.

    With stride 1 each tap reads the padded input in place: the output gradient is laid out on
    the padded width (zeros in the ``w_pad - w_out`` extra columns), so tap ``(u, v)`` is the
    flat window starting at ``u dh w_pad + v dw``, with no copy of the input per tap."""
    (kh, kw), (dh, dw), (sh, sw) = module.kernel_size, module.dilation, module.stride
    b, g = padded.shape[0], module.groups
    c_in, c_out = padded.shape[1] // g, grad_out.shape[1] // g
    h_out, w_out = grad_out.shape[-2:]
    out = grad_out.new_empty(kh * kw, b * g, c_in, c_out)
    d = grad_out.reshape(b * g, c_out, h_out, w_out)
    if (sh, sw) == (1, 1):
        w_pad = padded.shape[-1]
        flat = padded.reshape(b * g, c_in, -1)
        span = (h_out - 1) * w_pad + w_out
        wide = d.new_zeros(b * g, c_out, h_out, w_pad)
        wide[..., :w_out] = d
        d = wide.reshape(b * g, c_out, -1)[:, :, :span].transpose(1, 2)
        for u in range(kh):
            for v in range(kw):
                start = u * dh * w_pad + v * dw
                torch.bmm(flat[:, :, start : start + span], d, out=out[u * kw + v])
    else:
        d = d.reshape(b * g, c_out, h_out * w_out).transpose(1, 2)
        for u in range(kh):
            for v in range(kw):
                tap = padded[
                    :, :, u * dh : u * dh + sh * (h_out - 1) + 1 : sh,
                    v * dw : v * dw + sw * (w_out - 1) + 1 : sw,
                ]
                torch.bmm(tap.reshape(b * g, c_in, h_out * w_out), d, out=out[u * kw + v])
    return out.view(kh * kw, b, -1)


class PerSampleLayer:
    """A small layer's materialised per-sample gradients ``{param: (B, *shape)}``."""

    def __init__(self, grads: dict[nn.Parameter, Tensor]) -> None:
        self.grads = grads

    def sq_norms(self) -> Tensor:
        return sum(row_sq_norms(g) for g in self.grads.values())  # type: ignore[return-value]

    def add_weighted(
        self, weights: Tensor, keep: Tensor | None, into: dict[nn.Parameter, Tensor]
    ) -> None:
        for p, g in self.grads.items():
            per_sample = mask_rows(g, keep).reshape(len(g), -1)
            into[p].view(-1).addmv_(per_sample.T, in_dtype(weights, g.dtype))


def norm_layer_grads(
    module: nn.LayerNorm | nn.GroupNorm, inp: Tensor, grad_out: Tensor
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of a LayerNorm's or GroupNorm's affine parameters."""
    b = inp.shape[0]
    if isinstance(module, nn.LayerNorm):
        normalised = F.layer_norm(inp, module.normalized_shape, eps=module.eps)
        shape = (b, -1, *module.normalized_shape)
    else:
        normalised = F.group_norm(inp, module.num_groups, eps=module.eps)
        shape = (b, module.num_channels, -1)
    dims = 1 if isinstance(module, nn.LayerNorm) else 2
    grads = {}
    if module.weight is not None and module.weight.requires_grad:
        grads[module.weight] = (normalised * grad_out).reshape(shape).sum(dims)
    if module.bias is not None and module.bias.requires_grad:
        grads[module.bias] = grad_out.reshape(shape).sum(dims)
    return grads


def _conv_materialises(module: nn.Conv2d, grad_out: Tensor) -> bool:
    """Whether materialising beats the Gram trick for this convolution's weight."""
    t = grad_out.shape[-2] * grad_out.shape[-1]
    d_in = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
    return not gram_is_cheaper(t, d_in, module.out_channels // module.groups)


def _is_dense(module: nn.Module, calls: list[tuple[Tensor, Tensor]]) -> bool:
    """A Linear called once on ``(B, d_in)`` inputs (:class:`_DenseGrads`)."""
    return len(calls) == 1 and isinstance(module, nn.Linear) and calls[0][0].dim() == 2


def model_layer_grads(per_layer: dict[nn.Module, list[tuple[Tensor, Tensor]]]) -> list[LayerGrads]:
    """:func:`layer_grads` of every layer, in order, with one overflow check
    (:func:`all_normal`) for the factors of all dense layers together: when it passes, none of
    them needs :func:`balance_factors`'s rescaling; otherwise each layer makes its own check."""
    dense: dict[nn.Module, tuple[Tensor | None, Tensor]] = {}
    for module, calls in per_layer.items():
        if _is_dense(module, calls):
            a, d = calls[0]
            dense[module] = (row_sq_norms(a) if module.weight.requires_grad else None,
                             row_sq_norms(d))
    checked = [sq for module, pair in dense.items() if module.weight.requires_grad for sq in pair]
    normal = all_normal(checked) if checked else None  # type: ignore[arg-type]
    return [
        _DenseGrads(module, *calls[0], dense[module], normal or None)  # type: ignore[arg-type]
        if module in dense else layer_grads(module, calls)
        for module, calls in per_layer.items()
    ]


def layer_grads(module: nn.Module, calls: list[tuple[Tensor, Tensor]]) -> LayerGrads:
    """One layer's per-sample gradients from its (input, output gradient) per call."""
    if isinstance(module, nn.Embedding):
        return EmbeddingGrads(module, calls)
    if isinstance(module, nn.Conv2d):
        return _ConvGrads(module, calls)
    if isinstance(module, GHOST_LAYERS):
        if _is_dense(module, calls):
            return _DenseGrads(module, *calls[0])
        factors = [layer_factors(module, inp, grad) for inp, grad in calls]
        if len(factors) == 1:
            return _LayerGrads(module, *factors[0])
        a, d = (torch.cat(t, 1) for t in zip(*factors, strict=True))  # calls are positions
        return _LayerGrads(module, a, d)
    per_call = [norm_layer_grads(module, inp, grad) for inp, grad in calls]
    return PerSampleLayer({p: sum(c[p] for c in per_call) for p in per_call[0]})


#: What :func:`layer_grads` returns for one layer.
LayerGrads = _DenseGrads | _LayerGrads | _ConvGrads | EmbeddingGrads | PerSampleLayer
