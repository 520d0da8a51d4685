"""Small layers' per-sample gradients, materialised as one ``(B, N)`` matrix
(:class:`PerSampleLayer`): a LayerNorm's or GroupNorm's affine parameters formed from the
captured input and output gradient (:func:`norm_layer_grads`), and any layer the fast path has
no rule for (by ``vmap``, :mod:`dpfair.engine.layer_fallback`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpfair.engine.factors import (
    NormParts,
    cat_parts,
    in_dtype,
    mask_rows,
    row_norms,
    row_sq_norms,
)


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
