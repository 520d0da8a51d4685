"""One private training step (DESIGN.md section 4): norms -> rule -> weighted sum -> noise.

``PrivateStep`` sets ``p.grad`` of every trainable parameter to

    (sum_i w_i g_i + N(0, sigma^2 S^2 I)) / (q n)

with the weights ``w_i`` and sensitivity ``S`` of the method's rule, noise drawn once per step,
and division by the *expected* batch size ``q n`` (the realised one is private). The caller then
calls ``optimizer.step()``. ``nonprivate`` skips all of this: ``p.grad`` is the plain mean
gradient over the realised batch from one ordinary backward (no per-sample work, no noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpfair.privacy.gradients import EngineKind, LossFn, trainable_parameters
from dpfair.privacy.methods.base import Method, State


@dataclass(frozen=True)
class StepInfo:
    """What one step reports: ``sensitivity`` ``S``; ``state``, the method's state after the
    step's releases (e.g. ``C_k`` used by this DPSGD-F step, or ``C_{t+1}`` of adaptive
    clipping); ``nonprivate_batch_loss``, the mean per-sample loss over the realised batch at the
    point where the gradients were formed. The loss is NOT private: monitor it, never release it.
    """

    sensitivity: float
    state: State
    nonprivate_batch_loss: float


def per_sample_cross_entropy(outputs: Tensor, y: Tensor) -> Tensor:
    """The default loss: cross-entropy with ``reduction="none"``."""
    return nn.functional.cross_entropy(outputs, y, reduction="none")


class PrivateStep:
    """Computes a method's private gradient into ``p.grad``; see the module docstring.

    Args:
        model: the model; samples must not interact in its forward pass.
        method: the training method (``build_method``).
        sigma: noise multiplier of the gradient.
        expected_batch_size: ``q n``, the divisor of the summed update.
        engine: ``"auto"``, ``"fast"`` or ``"materialized"`` per-sample gradient path; the
            method may override it (BAM is materialised).
        loss_fn: per-sample loss ``(outputs, y) -> (B,)``; default cross-entropy.
    """

    def __init__(
        self,
        model: nn.Module,
        method: Method,
        *,
        sigma: float,
        expected_batch_size: float,
        engine: EngineKind = "auto",
        loss_fn: LossFn | None = None,
    ) -> None:
        if sigma < 0 or expected_batch_size <= 0:
            raise ValueError(
                f"need sigma >= 0 and expected_batch_size > 0, got {sigma}, {expected_batch_size}"
            )
        self.model, self.method = model, method
        self.sigma, self.expected_batch_size = sigma, expected_batch_size
        self.loss_fn = loss_fn or per_sample_cross_entropy
        self.params = trainable_parameters(model)
        self.sizes = [p.numel() for p in self.params]
        self.n_params = sum(self.sizes)
        # nonprivate needs no per-sample gradient: one ordinary backward of the mean loss
        self.plain = not method.is_private
        self.engine = None if self.plain else method.per_sample_gradients(model, engine)

    def __call__(self, x: Tensor, y: Tensor, g: Tensor, generator: torch.Generator) -> StepInfo:
        """One step on the Poisson-sampled batch ``(x, y, g)``; all noise comes from
        ``generator``, which must live on the model's device."""
        if self.plain:
            return self._plain_step(x, y)
        if len(x) == 0:  # an empty Poisson batch still releases noise (and counts)
            norms = torch.empty(0, dtype=self.params[0].dtype, device=self.params[0].device)
            rule = self.method.step_rule(norms, g, generator)
            loss = float("nan")
        else:
            norms = self.engine.compute(self.model, self.loss_fn, x, y, g)
            rule = self.method.step_rule(norms, g, generator)
            loss = float(self.engine.losses.mean())
        grads = self._noise(self.sigma * rule.sensitivity / self.expected_batch_size, generator)
        if len(x):  # 1 / (q n) folded into the weights: sum_i (w_i / (q n)) g_i, added in place
            self.engine.add_weighted_grad(rule.weights / self.expected_batch_size, grads)
        self.engine.observe(grads)
        for p, grad in zip(self.params, grads, strict=True):
            p.grad = grad
        return StepInfo(rule.sensitivity, self.method.state(), loss)

    def _noise(self, std: float, generator: torch.Generator) -> list[Tensor]:
        """``N(0, std^2 I)`` over the whole parameter vector in one draw, as fresh contiguous
        tensors shaped like the parameters (zeros when ``std`` is 0)."""
        p0 = self.params[0]
        flat = torch.empty(self.n_params, device=p0.device, dtype=p0.dtype)
        if std > 0:
            flat.normal_(0.0, std, generator=generator)
        else:
            flat.zero_()
        return [
            part.view_as(p).to(p.dtype)
            for part, p in zip(flat.split(self.sizes), self.params, strict=True)
        ]

    def _plain_step(self, x: Tensor, y: Tensor) -> StepInfo:
        """Non-private SGD: ``p.grad`` is the mean gradient over the realised batch."""
        for p in self.params:
            p.grad = None
        if len(x) == 0:
            for p in self.params:
                p.grad = torch.zeros_like(p)
            return StepInfo(0.0, self.method.state(), float("nan"))
        loss = self.loss_fn(self.model(x), y).mean()
        loss.backward()
        return StepInfo(0.0, self.method.state(), float(loss.detach()))
