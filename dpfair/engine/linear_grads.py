"""A Linear layer's per-sample gradients for the fast path (:mod:`dpfair.engine.layer_grads`).

Applied once per sample (:class:`DenseGrads`): the ghost norm ``|a_i|^2 |d_i|^2`` (Li et al.
2022; Bu et al., ICML 2023, Sec. 3); on positions (:class:`SequenceGrads`): the ``T x T`` Gram
trick or the per-sample gradient materialised, whichever the cost model expects faster
(:func:`dpfair.engine.factors.gram_route`: ghost ``2 B T^2 (p + d)`` against instantiation
``2 B T p d`` flops, with memory traffic and launches). The weighted sum is one contraction of
the (balanced) factors either way.
"""

from __future__ import annotations

from torch import Tensor, nn

from dpfair.engine.conv_factors import conv_patches
from dpfair.engine.factors import (
    NormParts,
    balance_factors,
    balanced,
    cat_parts,
    chunks,
    factor_norm_parts,
    gram_route,
    in_dtype,
    mask_rows,
    row_norms,
    row_sq_norms,
    square_sum,
)


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
