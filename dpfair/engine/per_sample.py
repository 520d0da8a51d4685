"""The per-sample gradient interface every engine implements (:class:`PerSampleGradients`):
per-sample norms ``|g_i|``, then the reweighted sum ``sum_i w_i g_i`` for the weights a method's
rule gives (clipping, ``w_i = min(1, C / |g_i|)``); the fast path is
:class:`dpfair.engine.gradients.GhostClipping`, the reference
:class:`dpfair.engine.materialized.Materialized`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor, nn

LossFn = Callable[[Tensor, Tensor], Tensor]


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters a step sets ``.grad`` for, in ``model.parameters()`` order."""
    return [p for p in model.parameters() if p.requires_grad]


def global_norm(tensors: list[Tensor]) -> Tensor:
    """The L2 norm of ``tensors`` taken together as one vector."""
    return torch.stack([t.square().sum() for t in tensors]).sum().sqrt()


def per_sample_losses(losses: Tensor, batch_size: int) -> Tensor:
    if losses.shape != (batch_size,):
        raise ValueError(
            f"loss_fn must return one loss per sample (reduction='none'): expected shape "
            f"({batch_size},), got {tuple(losses.shape)}"
        )
    return losses


class PerSampleGradients(ABC):
    """Computes per-sample gradient norms, then ``sum_i w_i g_i`` for any weights ``w``.

    ``compute`` must be called before ``weighted_grad``; ``losses`` then holds the detached
    per-sample losses of the batch (not private: for monitoring only).
    """

    losses: Tensor
    #: Whether ``g_i`` depends on sample ``i`` alone, so a batch may be formed in chunks
    #: (physical batches, :class:`dpfair.engine.step.PrivateStep`).
    chunkable: bool = True

    @abstractmethod
    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        """Per-sample gradient norms ``|g_i|``, shape ``(B,)``.

        ``groups`` is only read by gradient formers whose ``g_i`` depends on group ids (FairLens).
        """

    @abstractmethod
    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        """``sum_i w_i g_i`` for every trainable parameter; samples with ``w_i = 0`` are skipped."""

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        """Adds ``sum_i w_i g_i`` in place to ``into`` (one contiguous tensor per trainable
        parameter): the step adds the update to its freshly drawn noise this way."""
        for out, grad in zip(into, self.weighted_grad(weights), strict=True):
            out.add_(grad)

    def per_sample_dots(self, vectors: list[Tensor]) -> Tensor | None:
        """``<g_i, r>`` for every sample (``r``: one tensor per trainable parameter), from the
        per-sample state :meth:`compute` kept, or ``None`` where it keeps none (the caller
        then takes a double backward)."""
        return None

    def observe(self, private_grad: list[Tensor]) -> None:
        """Told each step's released (noised) gradient as the step ends (DP-SAT's former keeps
        it); the step's per-sample state is let go (:meth:`release`)."""
        self.release()

    def release(self) -> None:  # noqa: B027 - engines holding no state need nothing here
        """Drops what :meth:`compute` kept for :meth:`weighted_grad`."""
