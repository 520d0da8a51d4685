"""The per-sample squared norms ``|g_i|^2`` of a model, summed over its layers in few kernels.

Each layer hands its norm parts (:data:`dpfair.engine.factors.NormParts`: per-sample norms of its
parameters' gradients, or squared norms where a Gram product forms them); all norms are
squared and summed at once (:func:`dpfair.engine.factors.square_sum`), not one square and one
addition per layer. Convolutions of one shape (:meth:`dpfair.engine.conv_grads.ConvGrads.
group_key`) are held until a convolution of another shape arrives, so long as their
intermediates fit the memory budget together, and then form their norms with one matmul per
kernel tap for all of them (:func:`dpfair.engine.conv_grads.grouped_norms`). Both the factor
path and the low-memory path's backward (:mod:`dpfair.engine.low_memory`) add their layers
here, in the order they come.
"""

from __future__ import annotations

from torch import Tensor

from dpfair.engine.conv_grads import ConvGrads, grouped_norms
from dpfair.engine.factors import square_sum


class NormSum:
    """Collects the layers' norm parts (module docstring); :meth:`total` gives ``|g_i|^2``."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.norms: list[Tensor] = []
        self.squares: list[Tensor] = []
        self._pending: list[ConvGrads] = []
        self._key: tuple | None = None
        self._held = 0  # bytes the pending convolutions' norms will take together

    def add(self, layer) -> None:  # noqa: ANN001 - any LayerGrads
        """Adds one layer's parts, or holds a convolution for a group of its shape."""
        key = layer.group_key() if isinstance(layer, ConvGrads) else None
        if key is None:
            self._take(layer.norm_parts())
            return
        size = layer.held_bytes()
        if self._pending and (key != self._key or self._held + size > self.budget):
            self._flush()
        self._pending.append(layer)
        self._key, self._held = key, self._held + size

    def _take(self, parts: tuple[list[Tensor], list[Tensor]]) -> None:
        self.norms += parts[0]
        self.squares += parts[1]

    def _flush(self) -> None:
        if len(self._pending) == 1:
            self._take(self._pending[0].norm_parts())
        elif self._pending:
            self._take(grouped_norms(self._pending))
        self._pending, self._key, self._held = [], None, 0

    def total(self) -> Tensor | None:
        """``|g_i|^2`` of every layer added (``None`` where none has a part)."""
        self._flush()
        if not self.norms and not self.squares:
            return None
        return square_sum((self.norms, self.squares))
