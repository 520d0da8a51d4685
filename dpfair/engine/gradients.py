"""Per-sample gradient engine: per-sample norms, then the reweighted sum ``sum_i w_i g_i``.

Two implementations of one interface (:class:`dpfair.engine.per_sample.PerSampleGradients`),
and the factory choosing between them (:func:`make_engine`):

* :class:`GhostClipping` -- the fast path. One forward and one backward (to the layer outputs
  only, so no parameter gradient is formed twice); forward hooks keep each supported layer's
  input ``a`` and output, autograd gives the output gradients ``d``. A layer's per-sample
  gradient is ``sum_t d_t a_t^T`` (``t`` runs over sequence positions, or over the im2col
  patches of a convolution), so its squared norm is ``|a|^2 |d|^2`` for a Linear applied once
  per sample (the ghost-norm trick), else ``<a a^T, d d^T>`` (the ``T x T`` Gram trick) or the
  norm of the materialised per-sample gradient of that layer, whichever is expected faster. A
  convolution's per-sample gradient is materialised by one batched matmul per kernel tap or
  over the im2col patches of all taps (or its Gram route taken), only for its norms, a chunk of
  samples at a time (chunks sized to a memory budget, :mod:`dpfair.engine.factors`;
  :mod:`dpfair.engine.conv_grads`); convolutions of one shape do it together, and all layers'
  norms are squared and summed at once (:mod:`dpfair.engine.norm_sum`). An embedding's norm is
  exact from the token ids (:mod:`dpfair.engine.embedding_grads`). The weighted sum is one
  contraction of the ``w``-scaled output gradients with the inputs, added in place to the
  tensors the caller passes (the step's noise). LayerNorm and GroupNorm parameters are small:
  their per-sample gradients are materialised from the same captured input and output gradient.
  Any other layer with trainable parameters is materialised alone, by vmap of that layer
  (:mod:`dpfair.engine.layer_fallback`): a model falls back layer by layer. Where the layers'
  output gradients would not fit the memory budget, the norms are formed inside the backward
  pass, and the weighted sum partly by a second backward (:mod:`dpfair.engine.low_memory`).
* :class:`~dpfair.engine.materialized.Materialized` -- the reference: ``torch.func.vmap`` of
  ``torch.func.grad`` gives every per-sample gradient; it serves BAM where its fast ascent does
  not (:mod:`dpfair.engine.ascent`), models whose parameters are shared between modules, and
  models with a layer run without the batch axis.

``loss_fn(outputs, y)`` must return per-sample losses (``reduction="none"``). Samples must not
interact in the forward pass (no BatchNorm in training mode).

Overflow: both paths form ``|g_i|^2`` as a sum of squares in the model's dtype, so a sample whose
squared norm overflows (``|g_i|`` above ``sqrt(finfo.max)``, about ``1.8e19`` in float32) has an
infinite norm in both, and the rule gives it weight 0 (``Method.rule``); every other sample has
the same norm in both. Where a factor's squared norm ``|a|^2`` or ``|d|^2`` over- or underflows
while ``|g_i|^2`` does not (a saturated ``tanh`` on a huge input: ``d = 0``, ``|a|^2 = inf``),
the fast path first rescales the factors by opposite powers of two (exact; in
:mod:`dpfair.engine.layer_grads`), so that its products, and ``w_i a`` or ``w_i d`` in the
weighted sum, stay in range.
"""

from __future__ import annotations

import functools
import logging
import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from dpfair.engine.factors import cast_float, engine_budget, in_dtype
from dpfair.engine.layer_dots import layer_dots
from dpfair.engine.layer_fallback import (
    LayerPlan,
    output_tensors,
    plan_layers,
    probe_calls,
    vmap_layer_grads,
)
from dpfair.engine.layer_grads import LayerGrads, check_weight_factors, model_layer_grads
from dpfair.engine.low_memory import (
    NormSink,
    Tap,
    cuda_devices,
    rng_state,
    set_rng_state,
)
from dpfair.engine.materialized import Materialized, PerSampleFn
from dpfair.engine.norm_sum import NormSum
from dpfair.engine.per_sample import (
    LossFn,
    PerSampleGradients,
    global_norm,
    per_sample_losses,
    trainable_parameters,
)

#: The engine's public names (the interface and the reference live in their own modules).
__all__ = [
    "EngineKind", "GhostClipping", "KeptGraph", "LossFn", "Materialized", "PerSampleFn",
    "PerSampleGradients", "fast_path_obstacle", "global_norm", "log_once", "make_engine",
    "modifies_in_place", "plan_layers", "probe_calls", "trainable_parameters",
]

log = logging.getLogger(__name__)

EngineKind = Literal["auto", "fast", "materialized"]


# --------------------------------------------------------------------------- fast path


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, Tensor) else value


@dataclass
class KeptGraph:
    """What :class:`GhostClipping` hands a caller under ``keep_graph``, all with their graphs:
    the model's ``outputs``, the per-sample ``losses``, and per call of a fast layer its
    ``(module, input, output, output gradient)`` (the gradient of ``losses.sum()``, formed with
    ``create_graph``, so a function of it can be differentiated again; ``None`` where the
    output has no gradient). Calls are in forward order; a layer called twice has two."""

    outputs: Any
    losses: Tensor
    calls: list[tuple[nn.Module, Tensor, Tensor, Tensor | None]]


class GhostClipping(PerSampleGradients):
    """Fast path: ghost norms, Gram tricks, sparse embedding rows and small materialised norm
    layers (:mod:`dpfair.engine.layer_grads`) for the layers it knows; any other module owning
    trainable parameters gets its per-sample gradients by ``vmap`` of that layer alone
    (:mod:`dpfair.engine.layer_fallback`), so a model falls back layer by layer, never whole.

    A layer called several times in one forward (weight sharing) is handled by concatenating
    its calls along the position axis, which is exact since the per-sample gradient is a sum
    over positions. A parameter must be used only through its own module's forward (a weight
    read directly by another module is not seen); parameters shared between modules go to the
    materialised path (:func:`fast_path_obstacle`).

    Args:
        clone_outputs: copy each layer output before handing it on, for models that modify
            layer outputs in place (``ReLU(inplace=True)``), which would otherwise change the
            tensor whose gradient is taken. ``make_engine`` sets it when it sees such a module.
        keep_graph: run the one backward with ``create_graph`` and keep what a caller needs to
            differentiate through it (a :class:`KeptGraph`, taken by :meth:`take_graph`), for a
            caller forming second derivatives from the same forward and backward (FairLens's
            regulariser, :mod:`dpfair.engine.regularised`). The norms and weighted sums are
            unchanged (formed from detached factors). Only the factor path keeps it: not the
            low-memory path nor a model served whole by the materialised engine. Off by default
            (it costs the backward's graph); may be changed between steps.
    """

    #: Whether :meth:`compute` keeps each fast layer's captured (input, output gradient) calls
    #: in ``_calls``, for a subclass's second pass (:class:`dpfair.engine.ascent.AscentGhost`).
    keeps_calls = False
    #: Whether the convolutions keep the per-sample kernels their norms form (BAM's pass 1).
    keeps_kernels = False

    def __init__(
        self, clone_outputs: bool = False, low_memory: bool | None = None, keep_graph: bool = False
    ) -> None:
        self.clone_outputs, self.low_memory, self.keep_graph = clone_outputs, low_memory, keep_graph
        self._kept: KeptGraph | None = None
        self._held_per_input = 0.0  # bytes of layer output gradients per input element
        self._graph: Tensor | None = None  # low-memory path: the losses, their graph retained
        self._rest: list[int] = []  # the parameters (indices) whose sum takes that graph
        self._normal = False  # whether the last factor path's overflow check passed
        self._calls: dict[nn.Module, list[tuple[Tensor, Tensor]]] = {}
        self._layers: list[LayerGrads] = []
        self._params: list[nn.Parameter] = []
        self._all_finite = True
        self._plan: tuple[nn.Module, LayerPlan, Materialized | None] | None = None
        # the model's parameters and which were trainable when the plan was made
        self._plan_params: tuple[list[nn.Parameter], list[bool]] = ([], [])

    def _layer_plan(self, model: nn.Module, x: Tensor) -> LayerPlan:
        """The model's layer plan and trainable parameters (``self._params``), made again only
        for another model or when a parameter's ``requires_grad`` changed."""
        every, trainable = self._plan_params
        if (
            self._plan is None or self._plan[0] is not model
            or [p.requires_grad for p in every] != trainable
        ):
            every = list(model.parameters())
            self._plan_params = (every, [p.requires_grad for p in every])
            plan = plan_layers(model)
            shared, held = probe_calls(model, plan, x)
            self._held_per_input = held / max(x[:1].numel(), 1)
            if shared:
                log_once(
                    "per-sample gradients: materialised path, because "
                    f"{', '.join(shared)} run on an input without the batch axis (their output "
                    "gradient sums over samples); give them a batched input, e.g. "
                    "pos(positions.expand(batch_size, -1)), to keep the fast path"
                )
            self._plan = (model, plan, self._whole_engine() if shared else None)
        return self._plan[1]

    def _whole_engine(self) -> Materialized:
        """The materialised engine that serves a model some layer of which runs without the
        batch axis (a subclass forming ``g_i`` differently returns its own)."""
        return Materialized()

    def compute(
        self, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, groups: Tensor | None = None
    ) -> Tensor:
        plan = self._layer_plan(model, x)
        every, trainable = self._plan_params
        self._params = [p for p, t in zip(every, trainable, strict=True) if t]
        whole, self._kept = self._whole_model(), None
        if whole is not None:
            norms = whole.compute(model, loss_fn, x, y, groups)
            self.losses = whole.losses
            return norms
        self._layers, self._graph = [], None  # the last step's state, before this one's
        # (module, args, kwargs, outputs, their versions); args are (input,) on fast layers
        calls: list[tuple[nn.Module, tuple, dict, list[Tensor], list[int]]] = []
        keep = self.keep_graph
        inputs: list[Any] = []  # keep_graph: each call's first input, with its graph
        budget = engine_budget(x.device)
        sink = NormSink(calls, self._params[0].dtype, x.device, budget) if self._low_memory(
            plan, x, budget) else None
        rng = rng_state(x.device) if sink is not None else None

        def capture(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            outs = output_tensors(output)
            if keep:
                inputs.append(args[0] if args else None)
            if sink is not None:  # shapes only (autograd forbids in-place changes of a tap)
                outs = [torch.empty_like(o, device="meta") for o in outs]
            calls.append((
                module, tuple(_detached(a) for a in args),
                {k: _detached(v) for k, v in kwargs.items()}, outs, [o._version for o in outs],
            ))
            if sink is not None:  # only fast layers, one tensor out: norms in the backward
                return Tap.apply(output, sink.anchor, sink, len(calls) - 1)
            if not self.clone_outputs:
                return output
            if isinstance(output, Tensor):
                return output.clone()
            return type(output)(_clone(o) for o in output)

        modules = plan.fast + [m for _, m, _ in plan.slow]
        handles = [m.register_forward_hook(capture, with_kwargs=True) for m in modules]
        try:
            outputs = model(x)
        finally:
            for h in handles:
                h.remove()
        losses = per_sample_losses(loss_fn(outputs, y), x.shape[0])
        self.losses = losses.detach()
        targets = [o for c in calls for o in c[3] if o.requires_grad]
        if sink is not None:  # a layer called twice: the factor path, on a replay
            unique = len({id(c[0]) for c in calls}) == len(calls)
            norms = sink.norms(losses, x.shape[0]) if unique else None
            if norms is not None:
                self._layers, self._all_finite = sink.layers, True
                self._rest = [i for i, p in enumerate(self._params) if id(p) not in sink.kept]
                self._graph = losses if sink.second and self._rest else None
                return norms
            with torch.random.fork_rng(devices=cuda_devices(x.device)):  # as the first forward drew
                set_rng_state(rng, x.device)  # type: ignore[arg-type]
                self.low_memory, low = False, self.low_memory
                try:
                    return self.compute(model, loss_fn, x, y, groups)
                finally:
                    self.low_memory = low
        found = iter(torch.autograd.grad(
            losses.sum(), targets, allow_unused=True, create_graph=keep))
        kept: list[tuple[nn.Module, Tensor, Tensor, Tensor | None]] = []
        fast, batch = plan.fast_ids, x.shape[0]
        per_layer: dict[nn.Module, list[tuple[Tensor, Tensor]]] = {}
        self._layers = []
        dtype = self._params[0].dtype  # under autocast: norms and sums in the parameters' dtype
        with _autocast_off(x.device.type):
            for index, (module, args, kwargs, outs, versions) in enumerate(calls):
                if any(o._version != v for o, v in zip(outs, versions, strict=True)):
                    raise RuntimeError(
                        f"the output of {module} was modified in place after the layer ran; "
                        "use GhostClipping(clone_outputs=True) or an out-of-place activation"
                    )
                got = [next(found) if o.requires_grad else None for o in outs]
                # the factors never carry the kept graph
                grads = [cast_float(_detached(g) if keep else g, dtype) for g in got]
                if outs[0].dim() == 0 or outs[0].shape[0] != batch:
                    raise RuntimeError(f"{module} ran on an input without the batch axis")
                if id(module) in fast:
                    if keep:
                        kept.append((module, inputs[index], outs[0], got[0]))
                    grad = torch.zeros_like(outs[0], dtype=dtype) if grads[0] is None else grads[0]
                    per_layer.setdefault(module, []).append((cast_float(args[0], dtype), grad))
                else:
                    self._layers.append(vmap_layer_grads(
                        module, tuple(cast_float(a, dtype) for a in args),
                        {k: cast_float(v, dtype) for k, v in kwargs.items()},
                        [cast_float(o.detach(), dtype) for o in outs], grads,
                        tolerance=1e-4 if outs[0].dtype == dtype else 5e-2,
                    ))
            check = check_weight_factors(per_layer)
            self._normal = bool(check[1])
            room = max(0, budget - int(self._held_per_input * x.numel()))  # beside the factors
            self._layers += model_layer_grads(
                per_layer, check=check, keep=self.keeps_kernels, room=room
            )
            self._calls = per_layer if self.keeps_calls else {}
            if keep:
                self._kept = KeptGraph(outputs, losses, kept)
            sums = NormSum(budget)
            for layer in self._layers:
                sums.add(layer)
            squares = sums.total()
            norms = self._params[0].new_zeros(batch) if squares is None else squares.sqrt()
        # A finite norm means finite factors, and 0 * finite = 0: masking is only needed otherwise.
        # The norms are >= 0 or NaN, so their sum is finite only if every one is (one reduction;
        # a sum overflowing on finite norms only takes the masking path, exact as well).
        self._all_finite = math.isfinite(norms.sum())
        return norms

    def _low_memory(self, plan: LayerPlan, x: Tensor, budget: int) -> bool:
        """Whether this step forms its norms inside the backward pass and its weighted sum by a
        second one (:mod:`dpfair.engine.low_memory`): where ``low_memory`` says so, or
        (``None``) where the layers' output gradients would take more than ``budget``, as the
        plan's one-sample probe (:func:`probe_calls`) measured them, scaled to this batch: so a
        run's first step takes its later steps' path; never for a model with fallback layers,
        in-place activations or a subclass's second pass, nor under autocast (the second
        backward would run in bfloat16, not at the norms' precision)."""
        if self.low_memory is False or self.keeps_calls or self.clone_outputs or plan.slow:
            return False
        if torch.is_autocast_enabled(x.device.type):
            return False
        held = self._held_per_input * x.numel()
        return bool(self.low_memory) or held > budget

    def _whole_model(self) -> Materialized | None:
        """The materialised engine serving the whole model, where some layer runs without the
        batch axis (found once per model by :func:`probe_calls`)."""
        return None if self._plan is None else self._plan[2]

    def take_graph(self) -> KeptGraph | None:
        """The last :meth:`compute`'s :class:`KeptGraph` (``keep_graph``), handed over: the
        engine keeps no reference, so the caller's last use frees the graph. ``None`` where
        ``keep_graph`` is off, the factor path did not run, or it was taken already."""
        kept, self._kept = self._kept, None
        return kept

    def release(self) -> None:  # the factors, the retained graph, the captured calls
        self._layers, self._graph, self._calls, self._kept = [], None, {}, None
        whole = self._whole_model()
        if whole is not None:
            whole.release()

    def weighted_grad(self, weights: Tensor) -> list[Tensor]:
        summed = [torch.zeros_like(p) for p in self._params]
        self.add_weighted_grad(weights, summed)
        return summed

    def add_weighted_grad(self, weights: Tensor, into: list[Tensor]) -> None:
        whole = self._whole_model()
        if whole is not None:
            whole.add_weighted_grad(weights, into)
            return
        if self._graph is not None:  # the layers without factors: through the retained graph
            grads = torch.autograd.grad(
                self._graph, [self._params[i] for i in self._rest],
                in_dtype(weights, self._graph.dtype), retain_graph=True, allow_unused=True,
            )
            pairs = [(into[i], g) for i, g in zip(self._rest, grads, strict=True) if g is not None]
            if pairs:
                torch._foreach_add_([o for o, _ in pairs], [g for _, g in pairs])
        keep = None if self._all_finite else weights != 0
        targets = dict(zip(self._params, into, strict=True))
        for layer in self._layers:
            layer.add_weighted(weights, keep, targets)

    def per_sample_dots(self, vectors: list[Tensor]) -> Tensor | None:
        """From each layer's kept factors (:func:`dpfair.engine.layer_dots.layer_dots`);
        ``None`` on the low-memory path, which keeps none."""
        whole = self._whole_model()
        if whole is not None:
            return whole.per_sample_dots(vectors)
        if self._graph is not None or not self._layers:
            return None
        r = dict(zip(self._params, vectors, strict=True))
        return torch.stack([layer_dots(layer, r) for layer in self._layers]).sum(0)


def _autocast_off(device_type: str) -> AbstractContextManager:
    """Leaves autocast for the norms and sums, where it is on (entering it costs a step of a
    small model more than the check)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return nullcontext()


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


# ------------------------------------------------------------------------------ factory


def fast_path_obstacle(model: nn.Module) -> str | None:
    """Why the fast path (with its layer-by-layer fallback) cannot serve ``model`` at all, or
    ``None`` when it can: only a trainable parameter shared by two units (tied weights), whose
    per-sample norm is not the sum of the units' norms."""
    plan = plan_layers(model)
    seen: set[nn.Parameter] = set()
    units = [(m, False) for m in plan.fast] + [(m, True) for _, m, _ in plan.slow]
    for module, subtree in units:
        own = {p for p in module.parameters(recurse=subtree) if p.requires_grad}
        if seen & own:
            return f"{type(module).__name__} shares a parameter with another module"
        seen |= own
    return None


@functools.cache
def log_once(message: str) -> None:
    log.info(message)


def make_engine(model: nn.Module, kind: EngineKind = "auto") -> PerSampleGradients:
    """The per-sample gradient engine for ``model``.

    ``"auto"`` takes the fast path, where layers without a fast rule are materialised one layer
    at a time (which layers and why is logged once); only parameters shared between modules
    send the whole model to the materialised path (logged once too). ``"fast"`` raises unless
    every layer has a fast rule.
    """
    if kind not in ("auto", "fast", "materialized"):
        raise ValueError(f"engine must be 'auto', 'fast' or 'materialized', got {kind!r}")
    if kind == "materialized":
        return Materialized()
    reason = fast_path_obstacle(model)
    slow = plan_layers(model).slow
    if kind == "fast" and (reason or slow):
        why = reason or "; ".join(f"{name} ({why})" for name, _, why in slow)
        raise ValueError(f"the fast per-sample gradient path cannot serve this model: {why}")
    if reason is not None:
        log_once(f"per-sample gradients: materialised path, because {reason}")
        return Materialized()
    if slow:
        log_once(
            "per-sample gradients: fast path; materialised layer by layer for "
            + "; ".join(f"{name} ({why})" for name, _, why in slow)
        )
    return GhostClipping(clone_outputs=modifies_in_place(model))


def modifies_in_place(model: nn.Module) -> bool:
    """Whether some module of ``model`` may modify its input in place (``inplace=True``), so the
    fast path must clone layer outputs (``GhostClipping(clone_outputs=True)``)."""
    return any(getattr(m, "inplace", False) for m in model.modules())
