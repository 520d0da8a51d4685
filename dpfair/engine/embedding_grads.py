"""An embedding's per-sample gradients for the fast path (:mod:`dpfair.engine.layer_grads`):
exact norms from the token ids, never the ``V x d`` matrix per sample."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpfair.engine.factors import (
    NormParts,
    in_dtype,
    mask_rows,
    row_sq_norms,
)


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
