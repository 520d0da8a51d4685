"""The training loop's optimizers: SGD (momentum, weight decay) and Adam, the update rules of
``torch.optim.SGD`` and ``torch.optim.Adam`` (their defaults: no dampening, no Nesterov,
betas (0.9, 0.999), eps 1e-8, L2 weight decay added to the gradient), written out.

Why not ``torch.optim``: every ``torch.optim.Optimizer`` imports ``torch._dynamo`` when it
is built and at every step (its ``add_param_group`` and ``step`` are wrapped to disable
the compiler), about 3 s of a command's start on a 2-core CPU, for a training loop that
never compiles. The private step sets ``p.grad`` to the noised sum, and an optimizer only
post-processes it, so any update rule keeps the guarantee; these two are checked equal to
torch's, step by step, in tests/training/test_optim.py.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

__all__ = ["Adam", "Optimizer", "Sgd"]


class Optimizer:
    """A fixed list of parameters updated in place from their ``.grad`` (``None``: skipped)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, weight_decay: float) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        self.lr, self.weight_decay = lr, weight_decay

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def _grad(self, p: Tensor) -> Tensor:
        """The gradient with L2 weight decay added (``g + λ θ``)."""
        assert p.grad is not None
        return p.grad if not self.weight_decay else p.grad.add(p, alpha=self.weight_decay)

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is not None:
                self._update(i, p)

    def _update(self, i: int, p: Tensor) -> None:
        raise NotImplementedError


class Sgd(Optimizer):
    """``θ -= lr · b``, ``b = momentum · b + g`` (``b = g`` on the first step; without
    momentum ``b = g``): ``torch.optim.SGD`` with dampening 0, no Nesterov."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr, weight_decay)
        self.momentum = momentum
        self.buffers: dict[int, Tensor] = {}

    def _update(self, i: int, p: Tensor) -> None:
        d = self._grad(p)
        if self.momentum:
            buf = self.buffers.get(i)
            if buf is None:
                buf = self.buffers[i] = torch.clone(d).detach()
            else:
                buf.mul_(self.momentum).add_(d)
            d = buf
        p.add_(d, alpha=-self.lr)


class Adam(Optimizer):
    """Kingma & Ba 2015, Alg. 1, as ``torch.optim.Adam`` computes it:
    ``m = β1 m + (1 - β1) g``, ``v = β2 v + (1 - β2) g²``,
    ``θ -= lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + eps)``."""

    betas = (0.9, 0.999)
    eps = 1e-8

    def __init__(self, params: Iterable[nn.Parameter], lr: float, weight_decay: float = 0.0
                 ) -> None:
        super().__init__(params, lr, weight_decay)
        self.state: dict[int, tuple[Tensor, Tensor]] = {}
        self.steps: dict[int, int] = {}

    def _update(self, i: int, p: Tensor) -> None:
        d = self._grad(p)
        beta1, beta2 = self.betas
        if i not in self.state:
            self.state[i] = (torch.zeros_like(p), torch.zeros_like(p))
        m, v = self.state[i]
        t = self.steps[i] = self.steps.get(i, 0) + 1
        m.lerp_(d, 1 - beta1)
        v.mul_(beta2).addcmul_(d, d, value=1 - beta2)
        denom = (v.sqrt() / (1 - beta2 ** t) ** 0.5).add_(self.eps)
        p.addcdiv_(m, denom, value=-self.lr / (1 - beta1 ** t))
