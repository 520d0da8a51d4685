"""A convolution's per-sample factors: its input padded as it pads it, the im2col patches of
all kernel taps (one copy, :func:`conv_patches`), or its per-sample weight gradients one
batched matmul per tap with no copy of the input (:func:`conv_tap_grads`). Which of these (or
the Gram trick) forms a layer's norms is :class:`dpfair.engine.layer_grads`'s choice, by
estimated cost (:func:`dpfair.engine.factors.cheapest`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def conv_patches(module: nn.Conv2d, inp: Tensor) -> Tensor:
    """A convolution's im2col patches ``(B, G, c_in_g kh kw, T)`` (channel-major, then the
    kernel taps; ``T`` output positions last), from strided views of the padded input and one
    copy that reads and writes whole output rows (aten's CPU im2col is slower, and a
    positions-first layout copies element by element)."""
    (kh, kw), (dh, dw), (sh, sw) = module.kernel_size, module.dilation, module.stride
    padded = padded_input(module, inp)
    # (B, C, H_out, W_out, dh (kh - 1) + 1, dw (kw - 1) + 1), then every dilation-th tap
    patches = padded.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
    patches = patches[..., ::dh, ::dw].permute(0, 1, 4, 5, 2, 3)  # (B, C, kh, kw, H, W)
    b, t = inp.shape[0], patches.shape[-2] * patches.shape[-1]
    return patches.reshape(b, module.groups, -1, t)


def padded_input(module: nn.Conv2d, inp: Tensor) -> Tensor:
    """The input padded exactly as the module pads it ('same', non-zero padding modes)."""
    if not any(module._reversed_padding_repeated_twice):
        return inp
    mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
    return F.pad(inp, module._reversed_padding_repeated_twice, mode=mode)


def padded_inputs(module: nn.Conv2d, inputs: list[Tensor]) -> Tensor:
    """Several inputs of one shape padded as the module pads them, stacked along the batch:
    with zero padding one zero buffer and a copy of each input into its interior (no copy
    of a padded input again), else :func:`padded_input` of each, concatenated."""
    if len(inputs) == 1:
        return padded_input(module, inputs[0])
    pads = module._reversed_padding_repeated_twice
    if module.padding_mode != "zeros" or not any(pads):
        return torch.cat([padded_input(module, a) for a in inputs])
    left, right, top, bottom = pads
    b, c, h, w = inputs[0].shape
    out = inputs[0].new_zeros(len(inputs) * b, c, h + top + bottom, w + left + right)
    for i, a in enumerate(inputs):
        out[i * b : (i + 1) * b, :, top : top + h, left : left + w] = a
    return out


def conv_tap_grads(module: nn.Conv2d, inputs: list[Tensor], grads: list[Tensor]) -> Tensor:
    """Per-sample weight gradients of a convolution in tap-major layout
    ``(kh kw, B, G c_in c_out)``, one batched matmul per kernel tap:
    ``G_i[o, c, u, v] = sum_p d_i[o, p] x_i[c, p + (u, v)]`` (no im2col; only their norms are
    used, so the layout is the matmuls'). ``inputs`` and ``grads``: the layer inputs (not
    padded) and output gradients of one or more calls of one shape (of this layer, or of
    layers of one shape), whose samples are stacked along ``B``: one matmul per tap serves
    them all.

    With stride 1 each tap reads the padded input in place: the output gradient is laid out on
    the padded width (zeros in the ``w_pad - w_out`` extra columns), so tap ``(u, v)`` is the
    flat window starting at ``u dh w_pad + v dw``, with no copy of the input per tap."""
    (kh, kw), (dh, dw), (sh, sw) = module.kernel_size, module.dilation, module.stride
    padded = padded_inputs(module, inputs)
    b, g = padded.shape[0], module.groups
    c_in, c_out = padded.shape[1] // g, grads[0].shape[1] // g
    h_out, w_out = grads[0].shape[-2:]
    out = grads[0].new_empty(kh * kw, b * g, c_in, c_out)
    if (sh, sw) == (1, 1):
        w_pad = padded.shape[-1]
        flat = padded.reshape(b * g, c_in, -1)
        span = (h_out - 1) * w_pad + w_out
        wide = grads[0].new_zeros(b, g * c_out, h_out, w_pad)
        step = grads[0].shape[0]
        for i, d in enumerate(grads):
            wide[i * step : (i + 1) * step, :, :, :w_out] = d
        d = wide.reshape(b * g, c_out, -1)[:, :, :span].transpose(1, 2)
        for u in range(kh):
            for v in range(kw):
                start = u * dh * w_pad + v * dw
                torch.bmm(flat[:, :, start : start + span], d, out=out[u * kw + v])
    else:
        grad = grads[0] if len(grads) == 1 else torch.cat(grads)
        d = grad.reshape(b * g, c_out, h_out * w_out).transpose(1, 2)
        for u in range(kh):
            for v in range(kw):
                tap = padded[
                    :, :, u * dh : u * dh + sh * (h_out - 1) + 1 : sh,
                    v * dw : v * dw + sw * (w_out - 1) + 1 : sw,
                ]
                torch.bmm(tap.reshape(b * g, c_in, h_out * w_out), d, out=out[u * kw + v])
    return out.view(kh * kw, b, -1)
