"""The reference engine: every per-sample gradient materialised by ``torch.func.vmap`` of
``torch.func.grad`` (:class:`Materialized`); it serves BAM where its fast ascent does not
(:mod:`dpfair.engine.ascent`), models whose parameters are shared between modules, and models
with a layer run without the batch axis, and it is what the fast path is tested against.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from dpfair.engine.factors import mask_rows
from dpfair.engine.per_sample import LossFn, PerSampleGradients, per_sample_losses

PerSampleFn = Callable[[dict[str, Tensor], Tensor, Tensor], tuple[dict[str, Tensor], Tensor]]


class Materialized(PerSampleGradients):
    """Reference path: every per-sample gradient by ``vmap(grad(loss of one sample))``.

    Subclasses change how ``g_i`` is formed by overriding :meth:`per_sample_fn` (BAM).
    """

    def __init__(self) -> None:
        self._grads: list[Tensor] = []

    def per_sample_fn(self, grad_value: PerSampleFn) -> PerSampleFn:
        """Maps (trainable params, x_i, y_i) to (g_i, loss_i); the default is ``grad_value``."""
        return grad_value

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
        fixed = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
        fixed.update(dict(model.named_buffers()))

        def loss_one(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
            out = functional_call(model, (p, fixed), (xi.unsqueeze(0),))
            return loss_fn(out, yi.unsqueeze(0)).sum()

        fn = self.per_sample_fn(grad_and_value(loss_one))
        # autocast and torch.func's grad do not mix (dtype errors in the backward): this path
        # runs in the parameters' dtype
        with torch.autocast(x.device.type, enabled=False):
            grads, losses = vmap(fn, in_dims=(None, 0, 0), randomness="different")(params, x, y)
        self.losses = per_sample_losses(losses, x.shape[0]).detach()
        self._grads = [grads[n] for n in names]
        return torch.stack([g.flatten(1).square().sum(1) for g in self._grads]).sum(0).sqrt()

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        keep = weights != 0
        return [torch.tensordot(weights.to(g.dtype), mask_rows(g, keep), 1) for g in self._grads]

    def release(self) -> None:
        self._grads = []

    def per_sample_dots(self, vectors: list[Tensor]) -> Tensor | None:
        return torch.stack(
            [g.flatten(1) @ r.reshape(-1) for g, r in zip(self._grads, vectors, strict=True)]
        ).sum(0)
