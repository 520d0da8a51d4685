"""Per-sample inner products ``<g_i, r>`` of a layer's per-sample gradients with one vector
``r`` (the layer's share of it), from the factors the fast path keeps
(:mod:`dpfair.engine.layer_grads`), never a per-sample gradient formed again: for
``g_i = sum_t d_t a_t^T``, ``<g_i, R> = sum_t d_t . (R a_t)``; for a convolution that is
``sum_p d_p . (R * x)_p`` (one convolution of the input with ``R``); for an embedding
``sum_t d_t . R[id_t]``. FairLens's ``<g_i, r>`` for every sample (its regulariser's
gradient ``r``, Tran et al.) takes one such contraction per layer instead of a double backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpfair.engine import layer_grads as lg
from dpfair.engine.conv_factors import padded_input


def layer_dots(layer: lg.LayerGrads, r: dict[nn.Parameter, Tensor]) -> Tensor:
    """``<g_i, r>`` over the layer's trainable parameters, shape ``(B,)``; ``r`` maps each
    parameter to its part of the vector."""
    if isinstance(layer, lg.PerSampleLayer):
        return layer.flat @ torch.cat([r[p].reshape(-1) for p in layer.params])
    if isinstance(layer, lg.EmbeddingGrads):
        rows = r[layer.module.weight][layer.ids]  # (B, T, dim)
        return torch.linalg.vecdot(layer.d, rows).sum(1)
    if isinstance(layer, lg.DenseGrads):
        parts = [] if layer.bias is None else [layer.d @ r[layer.bias]]
        if layer.weight is not None:
            parts.append(torch.linalg.vecdot(layer.d_w @ r[layer.weight], layer.a_w))
        return torch.stack(parts).sum(0) if len(parts) > 1 else parts[0]
    if isinstance(layer, lg.SequenceGrads):
        m, b = layer.module, layer.batch_size
        parts = [] if layer.bias_grad is None else [layer.bias_grad.reshape(b, -1) @ r[m.bias]]
        if layer.a is not None and layer.d is not None:  # sum_t d_t . (R a_t)
            projected = layer.a @ r[m.weight].T  # (B, T, 1, d_out)
            parts.append((projected * layer.d).flatten(1).sum(1))
        return torch.stack(parts).sum(0) if len(parts) > 1 else parts[0]
    assert isinstance(layer, lg.ConvGrads)
    m = layer.module
    parts = [] if layer.bias_grad is None else [layer.bias_grad @ r[m.bias]]
    for a, d in layer.calls:  # sum_p d_p . (R * x)_p
        out = F.conv2d(padded_input(m, a), r[m.weight], stride=m.stride, dilation=m.dilation,
                       groups=m.groups)
        parts.append((out * d).flatten(1).sum(1))
    return torch.stack(parts).sum(0) if len(parts) > 1 else parts[0]
