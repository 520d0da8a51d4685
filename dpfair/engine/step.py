"""One private training step: norms -> rule -> weighted sum -> noise.

``PrivateStep`` sets ``p.grad`` of every trainable parameter to

    (sum_i w_i g_i + N(0, sigma^2 S^2 I)) / (q n)

with the weights ``w_i`` and sensitivity ``S`` of the method's rule, noise drawn once per step,
and division by the *expected* batch size ``q n`` (the realised one is private). The caller then
calls ``optimizer.step()``. ``nonprivate`` skips all of this: ``p.grad`` is the plain mean
gradient over the realised batch from one ordinary backward (no per-sample work, no noise).

Physical batches (``max_physical_batch``): a logical batch larger than that is processed in
chunks of at most that many samples. The rule of a method may need every per-sample norm of the
batch before it weights any sample (DPSGD-Global's scale, DPSGD-F's counts, adaptive
clipping's count), so a chunked step makes two passes: the norms of every chunk first (each
chunk's per-sample state is dropped as the next one is formed), then the rule once, the noise
once, and a second pass re-forming each chunk's per-sample gradients to add its weighted sum
(the last chunk of the first pass is still held, so it is not formed twice). The second pass
replays each chunk's random number generator state (dropout draws the same masks) and scales
a weight by ``min(1, n_i / n'_i)`` should a re-formed norm ``n'_i`` exceed the first ``n_i``,
so a contribution never exceeds what the rule bounded. Gradient formers with batch terms
(FairLens's regularisers: ``chunkable = False``) refuse chunking.

Memory (``max_engine_memory``, :meth:`PrivateStep.plan_memory`, decided before the first
step): the cap bounds the whole step's allocations, not only the engine's. Half of it is the
engine's (:func:`~dpfair.engine.factors.engine_memory`: per-sample intermediates of one layer
and the output gradients it holds, the low-memory path where they would take more); from the
other half go the parameter-sized tensors of the step (the noise that becomes the gradient,
and the weighted sum's temporaries: twice the parameters' bytes), and what is left sets the
physical batch: as many samples as the activations autograd saves for the backward fit, as a
probe forward on one and two samples measured them (:func:`saved_bytes_per_sample`). A cap
below the floor (one sample) is refused with the floor in the message; so is a cap that would
split the batch of a method that cannot be split (FairLens).

Mixed precision (``autocast="bf16"``): the forward and backward passes run under
``torch.autocast`` in bfloat16; the engine widens the captured activations and output
gradients (or the materialised per-sample gradients) to the parameters' dtype before it forms
the norms, so the norms, the weights, the noise and the summed update are all in full
precision and each sample's weight is applied to exactly the gradient whose norm it was set
for: clipping bounds every contribution as in float32. The materialised path (vmap of grad)
ignores autocast and runs in the parameters' dtype.

Several processes (``collective``, :class:`~dpfair.engine.collective.Collective`): each
forms the weighted sum of its part of the batch; the one process that draws noise starts its
sum from the noise, and the sums (with the counts of a side release, the loss and the batch
size) are added over the processes, so the update is the one-process update of the whole
batch, its noise drawn once.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor, nn

from dpfair.engine import State
from dpfair.engine.collective import ALONE, Collective
from dpfair.engine.factors import engine_memory, in_dtype
from dpfair.engine.gradients import EngineKind, LossFn, PerSampleGradients, trainable_parameters
from dpfair.engine.low_memory import cuda_devices, rng_state, set_rng_state
from dpfair.errors import ConfigError


class Rule(Protocol):
    """A step's per-sample weights ``(B,)`` and the L2 sensitivity of ``sum_i w_i g_i``."""

    weights: Tensor
    sensitivity: float


class Method(Protocol):
    """What the step asks of a training method (:class:`dpfair.methods.base.Method` is the
    implementation): how ``g_i`` is formed, and this step's rule from the norms."""

    name: str

    @property
    def is_private(self) -> bool: ...

    def per_sample_gradients(self, model: nn.Module, kind: EngineKind) -> PerSampleGradients: ...

    #: whether ``g_i`` holds terms of the whole batch (its batch cannot be split over processes)
    batch_terms: bool

    def step_rule(self, norms: Tensor, groups: Tensor, generator: torch.Generator,
                  collective: Collective = ALONE) -> Rule: ...

    def state(self) -> State: ...


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
            method may override it (BAM is materialised on layers its fast ascent lacks).
        loss_fn: per-sample loss ``(outputs, y) -> (B,)``; default cross-entropy.
        max_physical_batch: process larger batches in chunks of at most this many samples
            (module docstring); ``None``: one chunk.
        autocast: ``"bf16"`` runs forward and backward under bfloat16 autocast (module
            docstring); ``"off"`` (default) does not.
        max_engine_memory: MiB the whole step may allocate above what it starts with
            (module docstring, "Memory"); ``None``: no cap on the step, the engine's
            per-sample intermediates of one layer (and the layers' output gradients it holds)
            limited to 512 MiB on the CPU, a quarter of the free memory on a GPU. Only the
            chunking changes, not the update.
        collective: how the processes of a step combine their parts of the batch (module
            docstring); one process by default.
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
        max_physical_batch: int | None = None,
        autocast: Literal["off", "bf16"] = "off",
        max_engine_memory: int | None = None,
        collective: Collective = ALONE,
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
        if max_physical_batch is not None and max_physical_batch < 1:
            raise ConfigError(f"max_physical_batch must be >= 1, got {max_physical_batch}")
        if max_physical_batch and self.engine is not None and not self.engine.chunkable:
            raise ConfigError(
                f"method {method.name!r} forms its per-sample gradients from batch terms, so its "
                "batches cannot be split: remove max_physical_batch (or lower batch_size)"
            )
        self.max_physical_batch = max_physical_batch
        if autocast not in ("off", "bf16"):
            raise ConfigError(f"autocast must be 'off' or 'bf16', got {autocast!r}")
        self.autocast = autocast
        if max_engine_memory is not None and max_engine_memory < 1:
            raise ConfigError(f"max_engine_memory must be >= 1 (MiB), got {max_engine_memory}")
        self.engine_memory = None if max_engine_memory is None else max_engine_memory << 20
        if collective.several and method.batch_terms:
            raise ConfigError(
                f"method {method.name!r} forms its per-sample gradients from batch terms, so its "
                "batch cannot be split over processes: train it with nproc 1"
            )
        self.collective = collective
        self.cap_batch: int | None = None  # the physical batch the cap allows (plan_memory)

    def plan_memory(self, x: Tensor, y: Tensor) -> int | None:
        """The physical batch under ``max_engine_memory`` (module docstring, "Memory"), from
        the first sample of ``(x, y)``, once; ``None`` without a cap. Raises
        :class:`ConfigError` where the cap is below the floor of one sample's step."""
        if self.engine_memory is None or self.cap_batch is not None or self.plain:
            return self.cap_batch
        per_sample = saved_bytes_per_sample(self.model, self.loss_fn, x[:1], y[:1])
        fixed = 2 * self.n_params * self.params[0].element_size()
        room = self.engine_memory - self.engine_memory // 2 - fixed
        if room < per_sample:
            floor = math.ceil(2 * (fixed + per_sample) / 2**20)
            raise ConfigError(
                f"max_engine_memory {self.engine_memory >> 20} MiB is below what one sample's "
                f"step of this model needs, {floor} MiB (half the cap for the engine, the other "
                f"half for the step's parameter-sized tensors, {fixed / 2**20:.1f} MiB, and one "
                f"sample's saved activations, {per_sample / 2**20:.2f} MiB): set "
                f"max_engine_memory to at least {floor}, or leave it unset"
            )
        self.cap_batch = max(1, room // max(per_sample, 1))
        if not self.engine.chunkable and self.cap_batch < 2 * self.expected_batch_size:
            raise ConfigError(
                f"method {self.method.name!r} forms its per-sample gradients from batch terms, "
                f"so its batches cannot be split, and max_engine_memory "
                f"{self.engine_memory >> 20} MiB fits only {self.cap_batch} samples of this "
                f"model (a Poisson batch of expected size {self.expected_batch_size:g} needs "
                f"about {2 * self.expected_batch_size:g}): raise max_engine_memory, lower "
                "batch_size, or leave max_engine_memory unset"
            )
        return self.cap_batch

    def _precision(self, device: torch.device) -> AbstractContextManager:
        if self.autocast == "off":
            return nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def _chunks(self, n: int) -> list[slice]:
        size = max(1, min(self.max_physical_batch or n, self.cap_batch or n, n))
        if size < n and self.engine is not None and not self.engine.chunkable:  # twice the mean
            raise ConfigError(
                f"a Poisson batch of {n} samples exceeds the {self.cap_batch} that "
                f"max_engine_memory fits, and method {self.method.name!r} cannot split its "
                "batches: raise max_engine_memory or lower batch_size"
            )
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def __call__(self, x: Tensor, y: Tensor, g: Tensor, generator: torch.Generator) -> StepInfo:
        """One step on the Poisson-sampled batch ``(x, y, g)``; all noise comes from
        ``generator``, which must live on the model's device."""
        if self.plain:
            return self._plain_step(x, y)
        if len(x):
            self.plan_memory(x, y)
        cap = self.engine_memory
        with engine_memory(None if cap is None else cap // 2):
            return self._private_step(x, y, g, generator)

    def _private_step(
        self, x: Tensor, y: Tensor, g: Tensor, generator: torch.Generator
    ) -> StepInfo:
        if len(x) == 0:  # an empty Poisson batch still releases noise (and counts)
            norms = torch.empty(0, dtype=self.params[0].dtype, device=self.params[0].device)
            rule = self.method.step_rule(norms, g, generator, self.collective)
            grads = self._noise(self.sigma * rule.sensitivity / self.expected_batch_size, generator)
            return self._finish(grads, rule.sensitivity, 0.0, 0)
        chunks = self._chunks(len(x))
        whole = len(chunks) == 1  # one chunk: no slicing, no replay
        parts = [(x, y, g)] if whole else [(x[c], y[c], g[c]) for c in chunks]
        rng_states, norms, loss_sum = [], [], 0.0
        for part in parts:
            rng_states.append(None if whole else rng_state(x.device))
            with self._precision(x.device):
                norms.append(self.engine.compute(self.model, self.loss_fn, *part))
            loss_sum += float(self.engine.losses.sum())
        rule = self.method.step_rule(norms[0] if whole else torch.cat(norms), g, generator,
                                     self.collective)
        grads = self._noise(self.sigma * rule.sensitivity / self.expected_batch_size, generator)
        # 1 / (q n) folded into the weights: sum_i (w_i / (q n)) g_i, added in place
        weights = rule.weights / self.expected_batch_size
        for k in reversed(range(len(chunks))):  # the last chunk's state is still held
            w = weights if whole else weights[chunks[k]]
            if k != len(chunks) - 1:
                with torch.random.fork_rng(devices=cuda_devices(x.device)):
                    set_rng_state(rng_states[k], x.device)  # type: ignore[arg-type]
                    with self._precision(x.device):
                        again = self.engine.compute(self.model, self.loss_fn, *parts[k])
                w = w * _shrink(norms[k], again)
            self.engine.add_weighted_grad(w, grads)
        return self._finish(grads, rule.sensitivity, loss_sum, len(x))

    def _finish(
        self, grads: list[Tensor], sensitivity: float, loss_sum: float, size: int
    ) -> StepInfo:
        """Sets ``p.grad`` to the update summed over the processes; the loss is the mean over
        the whole realised batch (NaN when it is empty)."""
        loss_sum, size = self._sum(grads, loss_sum, size)
        if self.engine is not None:
            self.engine.observe(grads)
        for p, grad in zip(self.params, grads, strict=True):
            p.grad = grad
        return StepInfo(sensitivity, self.method.state(), loss_sum / size if size else math.nan)

    def _sum(self, grads: list[Tensor], loss_sum: float, size: int) -> tuple[float, int]:
        """``grads`` (in place), the loss sum and the batch size summed over the processes."""
        if not self.collective.several:
            return loss_sum, size
        totals = torch.tensor([loss_sum, size], dtype=torch.float64, device=grads[0].device)
        self.collective.sum_([*grads, totals])
        return float(totals[0]), int(totals[1])

    def _noise(self, std: float, generator: torch.Generator) -> list[Tensor]:
        """``N(0, std^2 I)`` over the whole parameter vector in one draw, as fresh contiguous
        tensors shaped like the parameters (zeros when ``std`` is 0 or another process draws
        the noise)."""
        p0 = self.params[0]
        flat = torch.empty(self.n_params, device=p0.device, dtype=p0.dtype)
        if std > 0 and self.collective.draws_noise:
            flat.normal_(0.0, std, generator=generator)
        else:
            flat.zero_()
        return [
            in_dtype(part.view_as(p), p.dtype)
            for part, p in zip(flat.split_with_sizes(self.sizes), self.params, strict=True)
        ]

    def _plain_step(self, x: Tensor, y: Tensor) -> StepInfo:
        """Non-private SGD: ``p.grad`` is the mean gradient over the realised batch (summed
        chunk by chunk over physical batches, and over the processes)."""
        for p in self.params:
            p.grad = None
        size = self._batch_size(len(x))
        if size == 0:
            for p in self.params:
                p.grad = torch.zeros_like(p)
            return StepInfo(0.0, self.method.state(), float("nan"))
        total = 0.0
        for c in self._chunks(len(x)):
            with self._precision(x.device):
                loss = self.loss_fn(self.model(x[c]), y[c]).to(self.params[0].dtype)
            loss = loss.sum() / size
            loss.backward()
            total += float(loss.detach())
        if self.collective.several:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            totals = torch.tensor([total], dtype=torch.float64, device=self.params[0].device)
            self.collective.sum_([*(p.grad for p in self.params), totals])
            total = float(totals[0])
        return StepInfo(0.0, self.method.state(), total)

    def _batch_size(self, local: int) -> int:
        """The realised batch size over all processes."""
        if not self.collective.several:
            return local
        size = torch.tensor([local], dtype=torch.float64, device=self.params[0].device)
        self.collective.sum_([size])
        return int(size[0])


def saved_bytes_per_sample(model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor) -> int:
    """Bytes a step takes per sample: twice what autograd saves for the backward (the saved
    activations, and their gradients), plus the largest saved tensor (a transient of the
    backward). Measured by the forward and per-sample loss of ``model`` on one and on two
    copies of the first sample of ``(x, y)`` under ``saved_tensors_hooks``, each saved storage
    counted once and the parameters' not (they are not per sample); the difference. The random
    number generators are left as they were."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def saved(n: int) -> int:
        storages: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            if t.device.type != "meta":
                storage = t.untyped_storage()
                if storage.data_ptr() not in params:
                    storages[storage.data_ptr()] = storage.nbytes()
            return t

        xs, ys = torch.cat([x[:1]] * n), torch.cat([y[:1]] * n)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_fn(model(xs), ys).sum()
        return sum(storages.values()), max(storages.values(), default=0)

    with torch.random.fork_rng(devices=cuda_devices(x.device)), torch.enable_grad():
        (one, top_one), (two, top_two) = saved(1), saved(2)
    # the saved activations, their gradients as the backward forms them (the engine holds
    # the layers' output gradients), and one more activation-sized transient
    return max(2 * (two - one) + top_two - top_one, 0)


def _shrink(first: Tensor, again: Tensor) -> Tensor:
    """``min(1, n_i / n'_i)`` (0 where the re-formed norm is not finite): a weight set for norm
    ``n_i`` never lets a re-formed gradient of a larger norm ``n'_i`` contribute more."""
    factor = torch.where(again <= first, 1.0, first / again)
    return torch.where(torch.isfinite(again), factor, 0.0)
