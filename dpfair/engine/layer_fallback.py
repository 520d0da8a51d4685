"""Per-sample gradients of one layer the fast path has no rule for, by ``vmap`` of that layer,
and the plan of which layers those are (:func:`plan_layers`).

The fast path (:class:`dpfair.engine.gradients.GhostClipping`) captures each such layer's
inputs in the forward pass and its output gradients in the one backward pass; the layer's
per-sample gradients are then ``vjp`` of the layer alone at sample ``i``'s inputs with sample
``i``'s output gradient, for every ``i`` at once (``torch.func.vmap``). Only this layer's
forward runs again, on single samples, so the rest of the model keeps its fast path (Bu et al.
2023's mixed clipping, applied layer by layer). The unit is a module owning trainable
parameters of its own together with its whole subtree (``nn.MultiheadAttention`` uses its
``out_proj`` weight without calling it).

A tensor argument is per-sample when its first dimension is the batch size; any other argument
is passed to every sample unchanged. Each sample sees a batch of one, as on the materialised
path. The recomputed outputs must equal the captured ones: a layer that draws randomness in
training (dropout inside it) or whose batch axis is not the first would otherwise get gradients
of a different function, so it raises instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap

from dpfair.engine.layer_grads import materialise_reason
from dpfair.engine.per_sample_layer import PerSampleLayer


def output_tensors(output: Any) -> list[Tensor]:
    """The tensors of a layer's output (a tensor, or a tuple or list holding tensors)."""
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, tuple | list):
        return [o for o in output if isinstance(o, Tensor)]
    raise TypeError(f"layer output of type {type(output).__name__} is not a tensor or a tuple")


def vmap_layer_grads(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outputs: list[Tensor],
    grads: list[Tensor | None],
    tolerance: float = 1e-4,
) -> PerSampleLayer:
    """One fallback unit's materialised per-sample gradients.

    Args:
        module: the unit (its trainable parameters, own and in its subtree).
        args, kwargs: the captured call (detached).
        outputs: the captured output tensors (detached), to check the recomputation (within
            ``tolerance``, relative: bf16 autocast outputs recomputed in float32 differ more).
        grads: their gradients (``None`` where the loss does not depend on one).
    """
    b = outputs[0].shape[0]
    trained = {n: p for n, p in module.named_parameters() if p.requires_grad}
    fixed: dict[str, Tensor] = {
        n: p.detach() for n, p in module.named_parameters() if not p.requires_grad
    }
    fixed.update(dict(module.named_buffers()))
    pairs = zip(outputs, grads, strict=True)
    cotangents = [torch.zeros_like(o) if g is None else g for o, g in pairs]

    def batched(t: Any) -> bool:
        return isinstance(t, Tensor) and t.dim() > 0 and t.shape[0] == b

    arg_dims = tuple(0 if batched(t) else None for t in args)
    kw_dims = {k: 0 if batched(v) else None for k, v in kwargs.items()}

    def one(params: dict[str, Tensor], a: tuple, kw: dict, cot: list[Tensor]):
        a = tuple(t if dim is None else t.unsqueeze(0) for t, dim in zip(a, arg_dims, strict=True))
        kw = {k: v if kw_dims[k] is None else v.unsqueeze(0) for k, v in kw.items()}

        def forward(p: dict[str, Tensor]) -> list[Tensor]:
            out = output_tensors(functional_call(module, (p, fixed), a, kw))
            return [o.squeeze(0) for o in out]

        out, pullback = vjp(forward, params)
        return pullback(cot)[0], out

    params = {n: p.detach() for n, p in trained.items()}
    batched_vjp = vmap(one, in_dims=(None, arg_dims, kw_dims, 0), randomness="different")
    per_sample, recomputed = batched_vjp(params, args, kwargs, cotangents)
    for got, want in zip(recomputed, outputs, strict=True):
        same = got.shape == want.shape and torch.allclose(
            got, want, rtol=tolerance, atol=tolerance / 10, equal_nan=True
        )
        if not same:
            raise RuntimeError(
                f"per-sample gradients of {type(module).__name__}: running it on single samples "
                "did not reproduce its batched output (randomness such as dropout inside it, or "
                "a batch axis that is not the first); use engine='materialized'"
            )
    return PerSampleLayer.of({trained[n]: g for n, g in per_sample.items()})


@dataclass(frozen=True)
class LayerPlan:
    """Which modules the fast path serves by a rule (``fast``) and which by ``vmap`` of the
    layer alone (``slow``: module, its name and why), for one model."""

    fast: list[nn.Module]
    slow: list[tuple[str, nn.Module, str]]

    @functools.cached_property
    def fast_ids(self) -> frozenset[int]:
        """``id`` of every fast layer."""
        return frozenset(id(m) for m in self.fast)


def plan_layers(model: nn.Module) -> LayerPlan:
    """Splits the modules owning trainable parameters into fast layers and fallback units (a
    module the fast path has no rule for, with its whole subtree; see
    :func:`dpfair.engine.layer_grads.materialise_reason`)."""
    fast: list[nn.Module] = []
    slow: list[tuple[str, nn.Module, str]] = []

    def visit(name: str, module: nn.Module) -> None:
        if any(p.requires_grad for p in module.parameters(recurse=False)):
            reason = materialise_reason(module)
            if reason is not None:
                slow.append((name or "model", module, reason))
                return
            fast.append(module)
        for child, sub in module.named_children():
            visit(f"{name}.{child}" if name else child, sub)

    visit("", model)
    return LayerPlan(fast, slow)


def probe_calls(model: nn.Module, plan: LayerPlan, x: Tensor) -> tuple[list[str], int]:
    """Two probe forwards, on batches of 1 and 2 copies of the first sample, without gradients
    and leaving the random number generators as they were. Returns the names of the planned
    layers some call of which does not carry the batch axis first (a position embedding of
    ``arange(T)`` broadcast over the batch: their output gradient is a sum over samples, so
    hooks cannot give per-sample gradients), and the bytes of the planned layers' floating
    outputs for one sample: what the fast path holds of output gradients per sample (an upper
    bound: a frozen layer's output may need none), known before the first step."""
    names = {id(m): n or "model" for n, m in model.named_modules()}
    sizes: dict[int, list[int]] = {}
    held = [0, True]  # the bytes, whether the one-sample probe is running

    def record(module: nn.Module, args: tuple, output: Any) -> None:
        outs = output_tensors(output)
        first = outs[0]
        sizes.setdefault(id(module), []).append(first.shape[0] if first.dim() else 0)
        if held[1]:
            held[0] += sum(o.numel() * o.element_size() for o in outs if o.is_floating_point())

    modules = plan.fast + [m for _, m, _ in plan.slow]
    handles = [m.register_forward_hook(record) for m in modules]
    devices = [x.device] if x.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model(x[:1])
            held[1] = False
            model(torch.cat([x[:1], x[:1]]))
    finally:
        for h in handles:
            h.remove()
    found = []
    for key, seen in sizes.items():
        half = len(seen) // 2
        if seen[:half] != [1] * half or seen[half:] != [2] * half:
            found.append(names[key])
    return found, int(held[0])
