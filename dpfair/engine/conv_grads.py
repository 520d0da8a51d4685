"""A convolution's per-sample gradients for the fast path (:mod:`dpfair.engine.layer_grads`).

A convolution keeps only its (balanced) inputs and output gradients. Its per-sample norms come a
chunk of samples at a time, by the route :func:`dpfair.engine.factors.cheapest` expects fastest
(:class:`ConvGrads`); convolutions of one shape on the route of one matmul per kernel tap form
their norms together, one matmul per tap for all of them (:func:`grouped_norms`, called by
:class:`dpfair.engine.norm_sum.NormSum`). The weighted sum is ``sum_i w_i G_i`` from the
per-sample gradients the norms formed where the route materialises them and they fit the
memory budget (:meth:`ConvGrads.keep_for_sum`), else one ``conv2d_weight`` of the
``w``-scaled output gradients.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from dpfair.engine.conv_factors import conv_patches, conv_tap_grads, padded_input
from dpfair.engine.factors import (
    NormParts,
    Route,
    balanced,
    cat_parts,
    cheapest,
    chunks,
    factor_norm_parts,
    in_dtype,
    mask_rows,
    row_norms,
    square_sum,
)


class ConvGrads:
    """A convolution keeps only its (balanced) inputs and output gradients. Its norms come a
    chunk of samples at a time, by the route :func:`cheapest` expects fastest: the
    per-sample weight gradients by one batched matmul per kernel tap (no copy of the input),
    or by one matmul over the im2col patches of all taps (one copy, fewer kernels), or, where
    there are few positions, the Gram trick over those patches
    (:mod:`dpfair.engine.conv_factors`); patches and per-sample gradients live only in their
    chunk (memory budget), unless ``keep`` (``kernels``, BAM's) or :meth:`keep_for_sum`
    (``grads``). The weighted sum is ``sum_i w_i G_i`` from ``grads`` where kept, else one
    ``conv2d_weight`` of the ``w``-scaled output gradients (zero padding inside it)."""

    def __init__(
        self, module: nn.Conv2d, calls: list[tuple[Tensor, Tensor]], budget: int,
        normal: bool | None = None, keep: bool = False,
    ) -> None:
        self.module, self.batch_size, self.budget = module, calls[0][0].shape[0], budget
        self.calls: list[tuple[Tensor, Tensor]] = []
        self.keep, self.kernels = keep, None  # (B c_out, c_in_g, kh, kw) if kept and formed
        #: the per-sample weight gradients in the route's layout, kept for the weighted sum
        #: (:meth:`keep_for_sum`): taps ``(kh kw, B, G c_in_g O)``, im2col ``(B, G, O, K)``
        self.for_sum, self.grads = False, None
        self.bias_grad = None
        if module.bias is not None and module.bias.requires_grad:
            self.bias_grad = functools.reduce(torch.add, [grad.sum((2, 3)) for _, grad in calls])
        if module.weight.requires_grad:
            self.calls = [balanced(inp, grad, normal)[:2] for inp, grad in calls]
        c_out, c_in_g, kh, kw = module.weight.shape
        g, taps = module.groups, kh * kw
        t = sum(grad.shape[-1] * grad.shape[-2] for _, grad in calls)
        k, self.o = c_in_g * taps, c_out // g
        inp = calls[0][0]
        x = inp[0].numel()  # the padded input, about
        o_t = self.o * t * g
        self.routes = {
            "taps": Route(2 * t * k * c_out, taps * (x + o_t) + 2 * k * c_out,
                          k * c_out + 2 * o_t + x, taps + 4),
            "im2col": Route(2 * t * k * c_out, 2 * t * k * g + o_t + 2 * k * c_out,
                            t * k * g + k * c_out + x, 5),
            "gram": Route(2 * t * t * (k + self.o + 1) * g, 2 * t * k * g + o_t + 6 * t * t * g,
                          (t * k + 3 * t * t) * g + x, 6),
        }
        self.route = cheapest(
            self.routes, self.batch_size, inp.element_size(), inp.device, budget
        )

    def _chunk(self, c: slice) -> tuple[NormParts, Tensor | None, Tensor | None]:
        """A chunk's norm parts, its per-sample kernels ``(b c_out, c_in_g, kh, kw)`` where
        the route forms them and ``keep`` asks, and its per-sample gradients where kept for
        the sum: per-tap products, or from patches ``(B, G, K, T)`` and ``d: (B, G, O, T)``."""
        m = self.module
        c_out, c_in_g, kh, kw = m.weight.shape
        if self.route == "taps":
            grads = functools.reduce(torch.add, [  # calls are positions: summed
                conv_tap_grads(m, [a[c]], [d[c]]) for a, d in self.calls
            ])  # (kh kw, b, G c_in_g O)
            norm = torch.linalg.vector_norm(grads, dim=(0, 2))
            kernels = tap_kernels(m, grads) if self.keep else None
            return ([norm], []), kernels, grads if self.for_sum else None
        a = cat_parts([conv_patches(m, a[c]) for a, _ in self.calls], 3)
        d = cat_parts([d[c].reshape(len(a), m.groups, self.o, -1) for _, d in self.calls], 3)
        if self.route == "gram":
            return factor_norm_parts(a, d, True), None, None
        grads = torch.einsum("bgkt,bgot->bgok", a, d)  # (b, G, O, c_in_g kh kw)
        kernels = grads.view(-1, c_in_g, kh, kw) if self.keep else None
        return ([row_norms(grads)], []), kernels, grads if self.for_sum else None

    def held_bytes(self) -> int:
        """Bytes of per-sample intermediates the chosen route holds for the whole batch."""
        return self.routes[self.route].held * self.calls[0][0].element_size() * self.batch_size

    def group_key(self) -> tuple | None:
        """Convolutions with one key (``None``: none) may form their norms together
        (:func:`grouped_norms`): one call on the route of one matmul per tap, the whole batch
        in one chunk; the key is the weight's shape, the convolution's arguments, the shapes
        of input and output gradient, their dtype and device."""
        if len(self.calls) != 1 or self.route != "taps":
            return None
        if self.held_bytes() > self.budget:
            return None
        m, (a, d) = self.module, self.calls[0]
        return (
            tuple(m.weight.shape), m.stride, m.dilation, m.groups, m.padding_mode,
            tuple(m._reversed_padding_repeated_twice), tuple(a.shape), tuple(d.shape), a.dtype,
            a.device,
        )

    def kernel_bytes(self) -> int:
        """Bytes of the per-sample kernels ``G_i`` of the whole batch."""
        return self.module.weight.numel() * self.calls[0][0].element_size() * self.batch_size

    def keep_for_sum(self, room: int) -> int:
        """Keeps the per-sample kernels its norms form, for the weighted sum, where the route
        materialises them and they fit ``room`` bytes (the book-keeping of Bu et al., ICML
        2023, with per-sample gradients instantiated, their "BK-MixOpt"): the sum is then
        ``sum_i w_i G_i``, ``B p d`` flops, not a ``conv2d_weight`` of ``2 B T p d``. Returns
        the bytes kept (0: the sum stays a contraction of the factors)."""
        if self.keep or not self.calls or self.route == "gram" or self.kernel_bytes() > room:
            return 0
        self.for_sum = True
        return self.kernel_bytes()

    def bias_parts(self) -> NormParts:
        return ([] if self.bias_grad is None else [row_norms(self.bias_grad)]), []

    def norm_parts(self) -> NormParts:
        """Per-sample norms (and squared norms) whose squares sum to ``|g_i|^2``."""
        norms, squares = self.bias_parts()
        if self.calls:
            slices = chunks(self.batch_size, self.held_bytes() // self.batch_size, self.budget)
            parts, kernels, grads = zip(*[self._chunk(c) for c in slices], strict=True)
            norms += [cat_parts([p[0][0] for p in parts])] if parts[0][0] else []
            squares += [cat_parts([p[1][0] for p in parts])] if parts[0][1] else []
            self.kernels = None if kernels[0] is None else cat_parts(list(kernels))
            if grads[0] is not None:
                self.grads = cat_parts(list(grads), 1 if self.route == "taps" else 0)
        return norms, squares

    def sq_norms(self) -> Tensor:
        return square_sum(self.norm_parts())

    def add_weighted(
        self, weights: Tensor, keep: Tensor | None, into: dict[nn.Parameter, Tensor]
    ) -> None:
        """Adds ``sum_i w_i g_i`` to ``into``; rows outside ``keep`` are zeroed first."""
        m, w = self.module, in_dtype(weights, self.module.weight.dtype)
        inner_pad = m.padding_mode == "zeros" and not isinstance(m.padding, str)
        if self.grads is not None:  # sum_i w_i G_i from the kept per-sample gradients
            self._add_kept(w, keep, into[m.weight])
        for a, d in [] if self.grads is not None else self.calls:
            dw = mask_rows(d, keep) * w.view(-1, 1, 1, 1)
            a = mask_rows(a, keep)
            into[m.weight].add_(torch.nn.grad.conv2d_weight(
                a if inner_pad else padded_input(m, a), m.weight.shape, dw, stride=m.stride,
                padding=m.padding if inner_pad else 0, dilation=m.dilation, groups=m.groups,
            ))
        if self.bias_grad is not None:
            bias = into[m.bias]  # type: ignore[index]
            bias.addmv_(mask_rows(self.bias_grad, keep).T, w)  # type: ignore[arg-type]


    def _add_kept(self, w: Tensor, keep: Tensor | None, out: Tensor) -> None:
        """Adds ``sum_i w_i G_i`` from the kept per-sample gradients (one batched
        matrix-vector product in the route's layout) to the weight's ``out``."""
        g = self.grads
        assert g is not None
        if self.route != "taps":  # (B, G, O, K): the weight's layout after the batch
            out.view(-1).addmv_(mask_rows(g.reshape(len(w), -1), keep).T, w)
            return
        if keep is not None:  # (kh kw, B, K): the batch is the second axis
            g = torch.where(keep.view(1, -1, 1), g, 0)
        c_out, c_in_g, kh, kw = out.shape
        taps, b = g.shape[:2]  # one matmul per tap, the taps' batch stride as it is (no copy)
        summed = torch.bmm(w.view(1, 1, b).expand(taps, 1, b), g)
        summed = summed.view(kh, kw, self.module.groups, c_in_g, self.o)
        out.add_(summed.permute(2, 4, 3, 0, 1).reshape(out.shape))


def grouped_norms(layers: list[ConvGrads]) -> NormParts:
    """The norm parts of convolutions of one :meth:`ConvGrads.group_key`: the weights' norms
    from one matmul per kernel tap over all their samples together (stacked along the batch;
    their per-sample gradients are those of each layer alone), as one ``(layers, B)`` part."""
    first = layers[0]
    grads = conv_tap_grads(
        first.module, [layer.calls[0][0] for layer in layers],
        [layer.calls[0][1] for layer in layers],
    )
    norms = [torch.linalg.vector_norm(grads, dim=(0, 2)).view(len(layers), first.batch_size)]
    b = first.batch_size
    for i, layer in enumerate(layers):
        norms += layer.bias_parts()[0]
        if layer.keep:
            layer.kernels = tap_kernels(layer.module, grads[:, i * b : (i + 1) * b])
        if layer.for_sum:
            layer.grads = grads[:, i * b : (i + 1) * b]
    return norms, []


def tap_kernels(module: nn.Conv2d, grads: Tensor) -> Tensor:
    """Per-sample kernels ``(b c_out, c_in_g, kh, kw)`` from the tap-major per-sample weight
    gradients ``(kh kw, b, G c_in_g O)`` of :func:`conv_tap_grads` (one copy)."""
    c_out, c_in_g, kh, kw = module.weight.shape
    g = module.groups
    kernels = grads.reshape(kh, kw, -1, g, c_in_g, c_out // g).permute(2, 3, 5, 4, 0, 1)
    return kernels.reshape(-1, c_in_g, kh, kw)
