"""FairLens's per-sample gradients (Tran et al. 2021, as implemented by Esipova et al.,
Alg. 4): those of ``l_i + gamma1 R1 + gamma2 R2`` for two groups ``a, b``, with
``R1 = |<g_{B_a} - g_{B_b}, gbar_B - g_B>|`` (group mean gradients; clipped minus unclipped
batch mean) and ``R2 = 1/2 (f_a (1 - f_a) + f_b (1 - f_b))`` (``f_k`` the group's mean
predicted probability of class 1). The regularisers are batch terms, so every
``g'_i = g_i + r`` with the same ``r = grad(gamma1 R1 + gamma2 R2)``.

``grad R1`` needs Hessian-vector products: writing
``u = g_{B_a} - g_{B_b} = grad sum_i alpha_i l_i`` and ``v = gbar_B - g_B = grad sum_i beta_i l_i``
with the clip factors held fixed, ``grad <u, v> = H_alpha v + H_beta u``, one double backward
(second derivatives: the per-layer factors do not hold them). ``u``, ``v`` and every
``<g_i, r>`` are first order and come from the engine's per-layer factors.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dpfair.engine.gradients import LossFn, PerSampleGradients, trainable_parameters


def _positive_probability(outputs: Tensor) -> Tensor:
    if outputs.dim() == 2 and outputs.shape[1] == 2:
        return outputs.softmax(1)[:, 1]
    if outputs.dim() == 1 or (outputs.dim() == 2 and outputs.shape[1] == 1):
        return outputs.reshape(-1).sigmoid()
    raise ValueError(f"fairlens needs a binary classifier, got outputs {tuple(outputs.shape)}")


def _dot(xs: list[Tensor], ys: list[Tensor]) -> Tensor:
    """``<x, y>`` of two parameter-shaped lists as one vector each (one product, not one per
    parameter)."""
    return torch.dot(torch.cat([a.reshape(-1) for a in xs]), torch.cat([b.reshape(-1) for b in ys]))


class RegularisedGradients(PerSampleGradients):
    """Wraps an engine: ``g'_i = g_i + r`` with ``r`` the gradient of the FairLens regularisers."""

    chunkable = False  # r is a batch term

    def __init__(self, inner: PerSampleGradients, C: float, gamma1: float, gamma2: float) -> None:
        self.inner, self.C, self.gamma1, self.gamma2 = inner, C, gamma1, gamma2
        self.shared: list[Tensor] = []

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        if groups is None:
            raise ValueError("fairlens needs the group ids of the batch")
        norms = self.inner.compute(model, loss_fn, x, y)
        self.losses = self.inner.losses
        keep = torch.isfinite(norms)  # the regularisers are formed from the finite samples
        params = trainable_parameters(model)
        outputs = model(x[keep])
        losses = loss_fn(outputs, y[keep])
        reg = self._regulariser(norms, keep, groups, outputs, losses, params)
        if reg.requires_grad:
            grads = torch.autograd.grad(reg, params, retain_graph=True, allow_unused=True)
        else:
            grads = (None,) * len(params)
        self.shared = [
            torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)
        ]
        sq = norms.square() + _dot(self.shared, self.shared)
        cross = self._cross(losses, params, keep)
        if cross is not None:
            sq[keep] = sq[keep] + 2 * cross.detach()
        return sq.clamp(min=0).sqrt()

    def _cross(self, losses: Tensor, params: list[nn.Parameter], keep: Tensor) -> Tensor | None:
        """``<g_i, r>`` of the kept samples: from the engine's per-layer factors, else
        ``J r = d/dv <J^T v, r>`` (a double backward)."""
        dots = self.inner.per_sample_dots(self.shared)
        if dots is not None:
            return dots[keep]
        v = torch.ones_like(losses, requires_grad=True)
        jt_v = torch.autograd.grad(losses, params, v, create_graph=True)
        return torch.autograd.grad(_dot(list(jt_v), self.shared), v, allow_unused=True)[0]

    def _regulariser(
        self,
        norms: Tensor,
        keep: Tensor,
        groups: Tensor,
        outputs: Tensor,
        losses: Tensor,
        params: list[nn.Parameter],
    ) -> Tensor:
        """``gamma1 R1 + gamma2 R2`` as a function of theta, with the clip factors held fixed."""
        prob, kept = _positive_probability(outputs), groups[keep]
        total = losses.new_zeros(())
        for k in (0, 1):  # R2
            if (kept == k).any():
                f = prob[kept == k].mean()
                total = total + self.gamma2 * 0.5 * f * (1 - f)
        in_group = [keep & (groups == k) for k in (0, 1)]
        sizes = [m.sum() for m in in_group]
        if sizes[0] == 0 or sizes[1] == 0:  # R1 needs both groups
            return total
        alpha = (in_group[0] / sizes[0] - in_group[1] / sizes[1]).to(norms.dtype)
        beta = torch.where(keep, ((self.C / norms).clamp(max=1.0) - 1) / keep.sum(), 0.0)
        u, v = self.inner.weighted_grad(alpha), self.inner.weighted_grad(beta)
        ju = torch.autograd.grad(losses, params, alpha[keep], create_graph=True)
        jv = torch.autograd.grad(losses, params, beta[keep], create_graph=True)
        inner = _dot(list(ju), v) + _dot(list(jv), u)  # its gradient: H_alpha v + H_beta u
        return total + self.gamma1 * torch.sign(_dot(u, v)) * inner

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        summed = [torch.zeros_like(r) for r in self.shared]
        self.add_weighted_grad(weights, summed)
        return summed

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        """``sum_i w_i (g_i + r) = sum_i w_i g_i + (sum_i w_i) r``."""
        self.inner.add_weighted_grad(weights, into)
        torch._foreach_add_(into, torch._foreach_mul(self.shared, weights.sum()))

    def release(self) -> None:
        self.inner.release()
        self.shared = []
