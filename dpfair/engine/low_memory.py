"""The engine's low-memory path (:class:`dpfair.engine.gradients.GhostClipping`).

Where a model's layer output gradients would not fit the engine's memory budget, the fast path
does not hold them all: a :class:`Tap` on each fast layer's output hands its gradient, as the
backward pass reaches it, to a :class:`NormSink`, which forms that layer's per-sample norms at
once (the ghost clipping of Li et al. 2022 and of Opacus, one layer output gradient at a time;
all layers' norms squared and summed together at the end, convolutions of one shape in one
pass: :class:`dpfair.engine.norm_sum.NormSum`). The layers nearest the input whose output
gradients fit the budget together keep them (book-keeping, Bu, Wang, Zha & Karypis, ICML 2023):
their share of ``sum_i w_i g_i`` is one contraction of the kept factors, as on the factor path.
The other layers' share is the gradient of ``sum_i w_i l_i`` with respect to their parameters
alone: one more backward through the retained graph, which stops above the kept layers
(autograd runs only the nodes that lead to the parameters asked for); none at all where every
layer keeps its factors.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from dpfair.engine.factors import all_normal, cast_float, cat_parts, engine_budget
from dpfair.engine.layer_grads import LayerGrads, tap_layer_grads
from dpfair.engine.norm_sum import NormSum


class Tap(torch.autograd.Function):
    """The identity on a layer's output, whose backward hands the output gradient to a
    :class:`NormSink` (while it is active). ``anchor`` ties every tap to one leaf, so that one
    backward to it reaches every tap and computes no parameter gradient."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, anchor: Tensor, sink: NormSink, index: int) -> Tensor:
        ctx.sink, ctx.index = sink, index
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        ctx.sink.take(ctx.index, grad)
        return grad, None, None, None


class NormSink:
    """The low-memory path's first backward: each fast layer's squared norms are formed as its
    output gradient arrives (:func:`dpfair.engine.layer_grads.tap_layer_grads`); the layers
    in ``keep`` (a prefix of the calls, nearest the input, module docstring) keep their factors
    for the weighted sum, every other layer's output gradient is dropped, so the held output
    gradients stay within the budget. The factors are not rescaled here: :meth:`norms`
    returns ``None`` where a factor's squared norm is not a normal number or a norm is not
    finite, and the engine then takes the factor path (which rescales and masks) on a replay
    of the same forward."""

    def __init__(
        self, calls: list, dtype: torch.dtype, device: torch.device, keep_bytes: int
    ) -> None:
        self.calls, self.dtype, self.budget = calls, dtype, engine_budget(device)
        self.keep_bytes = keep_bytes
        self.anchor = torch.zeros((), device=device, requires_grad=True)
        self.active = False
        self.keep: set[int] = set()
        #: whether some layer keeps no factors, so the weighted sum takes a second backward
        #: (and the first retains the graph); set by :meth:`norms`
        self.second = True
        self.layers: list[LayerGrads] = []  # the kept layers' factors
        self.kept: set[int] = set()  # ids of the parameters the kept layers own
        self.sums = NormSum(self.budget)
        self.checked: tuple[list[Tensor], list[Tensor]] = ([], [])  # the factors' norm parts

    def take(self, index: int, grad: Tensor) -> None:
        if self.active:
            module, args = self.calls[index][:2]
            layer, checked = tap_layer_grads(
                module, cast_float(args[0], self.dtype), cast_float(grad, self.dtype), self.budget
            )
            self.sums.add(layer)
            self.checked[0].extend(checked[0])
            self.checked[1].extend(checked[1])
            if index in self.keep:
                self.layers.append(layer)
                self.kept |= {id(p) for p in module.parameters(recurse=False)}

    def _choose_kept(self) -> None:
        """The longest prefix of the calls (forward order: nearest the input first) whose
        output gradients, in the norms' dtype, take at most ``keep_bytes`` together."""
        size, total = torch.empty((), dtype=self.dtype).element_size(), 0
        for index, call in enumerate(self.calls):
            total += call[3][0].numel() * size
            if total > self.keep_bytes:
                return
            self.keep.add(index)

    def norms(self, losses: Tensor, batch: int) -> Tensor | None:
        """The per-sample norms from one backward to the taps (the graph retained where a
        second backward follows), or ``None`` where the factor path must form them (class
        docstring)."""
        for module, _, _, outs, _ in self.calls:  # outs: the outputs' shapes (meta tensors)
            if outs[0].dim() == 0 or outs[0].shape[0] != batch:
                raise RuntimeError(f"{module} ran on an input without the batch axis")
        self._choose_kept()
        self.second = len(self.keep) < len(self.calls)
        self.calls[:] = [call[:2] for call in self.calls]
        self.active = True
        try:
            torch.autograd.grad(
                losses.sum(), self.anchor, retain_graph=self.second, allow_unused=True
            )
        finally:
            self.active, self.calls = False, []  # the retained graph's taps hold this sink
        squares = self.sums.total()
        if squares is None:
            return losses.new_zeros(batch, dtype=self.dtype)
        norms = squares.sqrt()
        factor_norms, factor_squares = self.checked
        checked = factor_squares + ([cat_parts(factor_norms).square()] if factor_norms else [])
        if not math.isfinite(norms.sum()) or (checked and not all_normal(checked)):
            return None
        return norms


def cuda_devices(device: torch.device) -> list[torch.device]:
    return [device] if device.type == "cuda" else []


def rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    """The global generators' state a forward pass draws from (dropout)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
