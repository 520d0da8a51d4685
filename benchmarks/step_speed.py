"""Step time of every training method against plain SGD and Opacus (issue "DP training engine").

In one run, on the same model, the same real data batch and the same thread count, every
method's full training step (``PrivateStep`` + ``optimizer.step()``) is timed together with two
references:

* **plain SGD** -- ``loss.mean().backward(); opt.step()`` with no per-sample machinery at all:
  the honest non-private baseline every ratio is taken against;
* **Opacus hooks** -- ``opacus.GradSampleModule`` (hooks mode, materialised per-sample
  gradients) + ``DPOptimizer`` (per-sample clipping, Gaussian noise, division by the expected
  batch size): the usual way to run DP-SGD. Opacus's own ghost clipping
  (``GradSampleModuleFastGradientClipping``) is timed too, for information.

Settings: the Adult MLP (2 x 256 tanh, 98 inputs from the real Adult data) at B = 256 and
B = 2048, Esipova's CNN on MNIST (1 x 28 x 28, B = 256), and issue #18's architectures on
random inputs (``arch_models.py``, scaled down for a CPU): a transformer classifier (Embedding
8000 x 128, 4 blocks of LayerNorm + attention from Linear layers + MLP, T = 64, B = 32) and a
WideResNet-16-4 with GroupNorm (3 x 16 x 16, B = 32). ``--memory`` adds each arm's peak memory
from a subprocess per arm (peak RSS on the CPU, CUDA max allocated on a GPU). Every arm first
runs warm-up steps, then the arms are timed round-robin in a fresh random order each round (so a
change of machine load hits all of them alike); a round times ``inner`` consecutive steps per arm
and the table gives the median over rounds of the per-step time.

Target (issue "DP training engine"): on the MLP a clip-rule method's step (dpsgd) costs at most
1.6x the plain SGD step and is at least 20x faster than the Opacus hooks step.

    .venv/bin/python benchmarks/step_speed.py            # the recorded run (~6 min on 2 cores)
    .venv/bin/python benchmarks/step_speed.py --quick    # a smoke run (~1 min)
    .venv/bin/python benchmarks/step_speed.py --device cuda

Writes benchmarks/results/step_speed.md (``--out`` to change).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as dt
import functools
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import opacus
import torch
from arch_models import TransformerClassifier, wide_resnet
from machine import cpu_model, load_average
from opacus.grad_sample import GradSampleModule, GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from pydantic import TypeAdapter
from torch import nn
from torch.profiler import ProfilerActivity, profile

from dpfair.data import load_dataset
from dpfair.engine.step import PrivateStep
from dpfair.methods import MethodConfig, build_method
from dpfair.models import build_model, n_params, parse_model_config

ROOT = Path(__file__).resolve().parent
DEFAULT_OUT = ROOT / "results" / "step_speed.md"
SIGMA = 1.0
LR = 1e-3  # small: the parameters barely move over the benchmark, so all arms see one model
PLAIN = "plain SGD (torch)"
OPACUS = "Opacus hooks (GradSampleModule + DPOptimizer)"
OPACUS_GHOST = "Opacus ghost clipping"
NOISE = "noise draw alone"
HANDWRITTEN = "hand-written minimal DP-SGD"
CLIP_RULE = "dpsgd"  # the clip-rule method the target is stated for

#: (label, method config) of every dpfair method; fairlens only on binary tabular data.
METHODS: list[tuple[str, dict]] = [
    ("nonprivate", {"name": "nonprivate"}),
    ("dpsgd", {"name": "dpsgd", "C": 1.0}),
    ("dpsgd normalize", {"name": "dpsgd", "C": 1.0, "normalize": True}),
    ("dpsgd_f", {"name": "dpsgd_f", "C0": 1.0}),
    ("naive_reweight", {"name": "naive_reweight", "C0": 1.0}),
    ("dpsgd_global", {"name": "dpsgd_global", "C0": 1.0, "Z": 50.0}),
    ("adaclip", {"name": "adaclip"}),
    ("dpsgd_global_adapt", {"name": "dpsgd_global_adapt"}),
    ("bounded_adaptive", {"name": "bounded_adaptive"}),
    ("bam", {"name": "bam"}),
    ("dp_sat", {"name": "dp_sat"}),
    ("fairlens", {"name": "fairlens"}),
]
#: dpsgd on the materialised (torch.func vmap) engine: what the fast path saves.
MATERIALIZED = ("dpsgd (materialized engine)", {"name": "dpsgd", "C": 1.0})
#: BAM on the materialised engine (what its fast ascent saves), timed where a setting asks.
BAM_MATERIALIZED = ("bam (materialized engine)", {"name": "bam"})
_METHOD_ADAPTER: TypeAdapter = TypeAdapter(MethodConfig)


@dataclass(frozen=True)
class Setting:
    """One model + batch: ``dataset`` is loaded with ``options`` and the first ``batch`` training
    rows (after a seeded shuffle) form the batch every arm steps on."""

    label: str
    dataset: str
    options: dict | None
    model: dict
    batch: int
    tabular_binary: bool
    #: the method labels timed (default: all of METHODS and the materialised dpsgd)
    methods: tuple[str, ...] | None = None
    #: further materialised arms timed (BAM_MATERIALIZED)
    also: tuple[str, ...] = ()
    #: the batch of the kernel and memory columns (``--memory``) where it differs from the
    #: timed one (a GPU-sized setting a CPU times at a smaller batch)
    memory_batch: int | None = None
    #: the arms measured with ``--memory`` (default: all)
    memory_arms: tuple[str, ...] | None = None


#: the arms whose kernels and memory a setting measures where it does not measure all
KEY_ARMS = (PLAIN, OPACUS, OPACUS_GHOST, "dpsgd", "bam")
SETTINGS = [
    Setting("Adult MLP, B=256", "adult", {}, {"name": "mlp", "hidden": [256, 256],
                                              "activation": "tanh"}, 256, True,
            also=(BAM_MATERIALIZED[0],), memory_arms=KEY_ARMS + (HANDWRITTEN, "fairlens")),
    Setting("Adult MLP, B=2048", "adult", {}, {"name": "mlp", "hidden": [256, 256],
                                               "activation": "tanh"}, 2048, True),
    Setting("MNIST CNN (esipova_cnn), B=256", "mnist", None, {"name": "esipova_cnn"}, 256, False,
            also=(BAM_MATERIALIZED[0],), memory_arms=KEY_ARMS),
    # issue #18's architectures on random inputs (benchmarks/arch_models.py), scaled for a CPU
    Setting(
        "Transformer (Embedding 8000x128, 4 blocks, T=64), B=32", "random_tokens", None,
        {"name": "transformer", "vocab": 8000, "dim": 128, "blocks": 4, "seq": 64}, 32, False,
        ("nonprivate", "dpsgd", "dpsgd_global", "dp_sat", "bam", MATERIALIZED[0]),
        also=(BAM_MATERIALIZED[0],),
    ),
    Setting(
        "WideResNet-16-4 (GroupNorm), 3x16x16, B=32", "random_images", None,
        {"name": "wide_resnet", "size": 16}, 32, False,
        ("nonprivate", "dpsgd", "dpsgd_global", "dp_sat", "bam"), also=(BAM_MATERIALIZED[0],),
    ),
    # issue 29's GPU-sized settings: timed at a CPU-sized batch, kernels and memory at B=256/64
    Setting(
        "WideResNet-16-4 (GroupNorm), 3x32x32, timed at B=16, kernels and memory at B=256",
        "random_images", None, {"name": "wide_resnet", "size": 32}, 16, False,
        ("dpsgd", "bam"), memory_batch=256, memory_arms=(PLAIN, OPACUS_GHOST, "dpsgd"),
    ),
    Setting(
        "Transformer (Embedding 8000x256, 4 blocks, T=128), timed at B=8, kernels and memory "
        "at B=64", "random_tokens", None,
        {"name": "transformer", "vocab": 8000, "dim": 256, "blocks": 4, "seq": 128}, 8, False,
        ("dpsgd", "bam"), memory_batch=64, memory_arms=(PLAIN, OPACUS_GHOST, "dpsgd"),
    ),
]
#: aten ops that launch no kernel on a GPU: views, allocations and metadata
NO_KERNEL = frozenset(f"aten::{name}" for name in (
    "view as_strided as_strided_ empty empty_strided empty_like new_empty new_empty_strided "
    "reshape _reshape_alias _unsafe_view transpose t permute expand expand_as unsqueeze "
    "squeeze select slice narrow split split_with_sizes unbind chunk unfold flatten unflatten "
    "view_as detach alias lift_fresh resize_ set_ item _local_scalar_dense is_nonzero "
    "result_type resolve_conj resolve_neg contiguous to _to_copy diagonal movedim"
).split())


@dataclass
class Arm:
    """One timed thing: ``step()`` does one full training step (gradient + optimizer step)."""

    label: str
    kind: str  # "reference" | "method"
    step: Callable[[], None]
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_arm(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Arm:
    """Non-private SGD exactly as a plain torch loop does it."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y, reduction="none")
        loss.mean().backward()
        opt.step()

    return Arm(PLAIN, "reference", step)


def noise_arm(n_params: int, device: torch.device) -> Arm:
    """The Gaussian draw every private step makes (one N(0, sigma^2 C^2) per parameter, from
    a seeded torch generator) and nothing else: the floor of a private step's extra cost."""
    gen = torch.Generator(device=device).manual_seed(0)

    def step() -> None:
        torch.empty(n_params, device=device).normal_(0.0, SIGMA, generator=gen)

    return Arm(NOISE, "reference", step)


def handwritten_arm(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, batch: int) -> Arm:
    """The least a DP-SGD step on an MLP can do, written out for this model with no engine, no
    method object and no checks: forward keeping each Linear's input and output, one backward
    to the outputs, ghost norms ``|d|^2 (|a|^2 + 1)``, clip weights ``min(1, C / |g_i|)``, one
    noise draw, then ``(w d)^T a`` added in place to the noise. A yardstick for what dpfair's
    abstractions cost on top, not a method: it handles no non-finite gradient."""
    linears = [m for m in model if isinstance(m, nn.Linear)]
    params = [p for m in linears for p in (m.weight, m.bias)]
    sizes = [p.numel() for p in params]
    opt = torch.optim.SGD(params, lr=LR)
    gen = torch.Generator(device=x.device).manual_seed(0)
    clip = 1.0

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        inputs, outputs, h = [], [], x
        for module in model:
            if isinstance(module, nn.Linear):
                inputs.append(h.detach())
                h = module(h)
                outputs.append(h)
            else:
                h = module(h)
        losses = nn.functional.cross_entropy(h, y, reduction="none")
        grads_out = torch.autograd.grad(losses.sum(), outputs)
        vecdot = torch.linalg.vecdot
        sq = sum(vecdot(d, d) * (vecdot(a, a) + 1) for a, d in zip(inputs, grads_out, strict=True))
        w = (clip / sq.sqrt()).clamp(max=1.0) / batch
        flat = torch.empty(sum(sizes), device=x.device).normal_(
            0.0, SIGMA * clip / batch, generator=gen
        )
        grads = [part.view_as(p) for part, p in zip(flat.split(sizes), params, strict=True)]
        for i, (a, d) in enumerate(zip(inputs, grads_out, strict=True)):
            grads[2 * i].addmm_((d * w.unsqueeze(1)).T, a)
            grads[2 * i + 1].addmv_(d.T, w)
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad
        opt.step()

    return Arm(HANDWRITTEN, "reference", step)


def _opacus_optimizer(cls: type[DPOptimizer], gsm: nn.Module, batch: int,
                      device: torch.device) -> DPOptimizer:
    """Opacus's DP optimizer over SGD: clip at C = 1, N(0, sigma^2), divide by ``batch``."""
    return cls(
        torch.optim.SGD(gsm.parameters(), lr=LR),
        noise_multiplier=SIGMA,
        max_grad_norm=1.0,
        expected_batch_size=batch,
        loss_reduction="mean",
        generator=torch.Generator(device=device).manual_seed(0),
    )


def opacus_arm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> Arm:
    """Opacus 1.6 hooks mode: per-sample gradients materialised by hooks, DPOptimizer clips
    each at C = 1, adds N(0, sigma^2 C^2) and divides by the expected batch size."""
    gsm = GradSampleModule(model, loss_reduction="mean")
    opt = _opacus_optimizer(DPOptimizer, gsm, batch, x.device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(gsm(x), y)
        loss.backward()
        opt.step()

    return Arm(OPACUS, "reference", step)


def opacus_ghost_arm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> Arm:
    """Opacus 1.6 ghost clipping (two backward passes, no materialised per-sample gradients)."""
    gsm = GradSampleModuleFastGradientClipping(
        model, max_grad_norm=1.0, use_ghost_clipping=True, loss_reduction="mean"
    )
    opt = _opacus_optimizer(DPOptimizerFastGradientClipping, gsm, batch, x.device)
    criterion = DPLossFastGradientClipping(gsm, opt, nn.CrossEntropyLoss(), "mean")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = criterion(gsm(x), y)
        loss.backward()
        opt.step()

    return Arm(OPACUS_GHOST, "reference", step)


def method_arm(
    label: str,
    cfg: dict,
    model: nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    n_groups: int,
    engine: str = "auto",
) -> Arm:
    """A dpfair method: ``PrivateStep`` sets ``p.grad``, then SGD steps (as ``train`` does)."""
    x, y, g = batch
    method = build_method(
        _METHOD_ADAPTER.validate_python(cfg),
        n_groups=n_groups,
        sigma=SIGMA,
        expected_batch_size=float(len(x)),
    )
    private_step = PrivateStep(
        model, method, sigma=SIGMA, expected_batch_size=float(len(x)), engine=engine
    )
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator(device=x.device).manual_seed(0)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        private_step(x, y, g, gen)
        opt.step()

    return Arm(label, "method", step)


def _synthetic(setting: Setting, device: torch.device, seed: int):
    """Random inputs of the setting's shape and its model (issue #18's architectures)."""
    gen = torch.Generator().manual_seed(seed)
    spec, b = setting.model, setting.batch
    torch.manual_seed(seed)
    if spec["name"] == "transformer":
        model = TransformerClassifier(spec["vocab"], spec["dim"], spec["blocks"], spec["seq"], 2)
        x = torch.randint(0, spec["vocab"], (b, spec["seq"]), generator=gen)
        shape, classes = (spec["seq"],), 2
    else:
        model, shape, classes = wide_resnet(), (3, spec["size"], spec["size"]), 10
        x = torch.randn(b, *shape, generator=gen)
    y = torch.randint(0, classes, (b,), generator=gen)
    g = torch.randint(0, 2, (b,), generator=gen)
    info = {"input_shape": shape, "n_params": n_params(model), "n_groups": 2,
            "n_classes": classes}
    return model.to(device), (x.to(device), y.to(device), g.to(device)), info


def arm_factories(
    setting: Setting, device: torch.device, seed: int
) -> tuple[list[tuple[str, Callable[[], Arm]]], dict]:
    """``(label, build)`` of every arm of ``setting``; each build takes its own copy of one
    initialised model (a per-arm subprocess builds only its own arm)."""
    if setting.dataset.startswith("random_"):
        base, (x, y, g), info = _synthetic(setting, device, seed)
    else:
        ds = load_dataset(setting.dataset, setting.options)
        perm = torch.randperm(len(ds.train), generator=torch.Generator().manual_seed(seed))
        rows = perm[: setting.batch]
        x, y, g = (t[rows].to(device) for t in (ds.train.x, ds.train.y, ds.train.g))
        torch.manual_seed(seed)
        base = build_model(parse_model_config(setting.model), ds.input_shape, ds.n_classes)
        base = base.to(device)
        info = {
            "input_shape": tuple(ds.input_shape),
            "n_params": n_params(base),
            "n_groups": ds.n_groups,
            "n_classes": ds.n_classes,
        }
    n_groups, b = info["n_groups"], setting.batch

    def fresh() -> nn.Module:
        return copy.deepcopy(base)

    out: list[tuple[str, Callable[[], Arm]]] = [
        (PLAIN, lambda: plain_arm(fresh(), x, y)),
        (OPACUS, lambda: opacus_arm(fresh(), x, y, b)),
        (OPACUS_GHOST, lambda: opacus_ghost_arm(fresh(), x, y, b)),
        (NOISE, lambda: noise_arm(info["n_params"], device)),
    ]
    if setting.tabular_binary:  # the MLP: a Sequential of Linear layers and activations
        out.append((HANDWRITTEN, lambda: handwritten_arm(fresh(), x, y, b)))
    wanted = setting.methods
    for label, cfg in METHODS:
        if cfg["name"] == "fairlens" and not (setting.tabular_binary and n_groups == 2):
            continue
        if wanted is None or label in wanted:
            out.append((label, functools.partial(
                lambda lb, c: method_arm(lb, c, fresh(), (x, y, g), n_groups), label, cfg
            )))
    for label, cfg in (MATERIALIZED, BAM_MATERIALIZED):
        if (wanted is None and label == MATERIALIZED[0]) or label in (wanted or ()) + setting.also:
            out.append((label, functools.partial(
                lambda lb, c: method_arm(lb, c, fresh(), (x, y, g), n_groups, "materialized"),
                label, cfg,
            )))
    return out, info


def build_arms(setting: Setting, device: torch.device, seed: int) -> tuple[list[Arm], dict]:
    """Every arm of ``setting`` that can be built (an Opacus arm may refuse a model: its label
    and error are in ``info["skipped"]``)."""
    factories, info = arm_factories(setting, device, seed)
    arms, info["skipped"] = [], {}
    for label, build in factories:
        try:
            arms.append(build())
        except Exception as exc:  # noqa: BLE001 - a reference that cannot run is reported
            info["skipped"][label] = f"{type(exc).__name__}: {exc}"[:200]
    return arms, info


def _status_mb(field_name: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM) in MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def kernel_count(events: list) -> int:
    """Kernels a step launches, counted on the CPU from a ``torch.profiler`` trace: each aten op
    that does work (not :data:`NO_KERNEL`) and calls no such op itself counts once (a
    composite op counts its parts), and a ``_foreach_`` op once (one launch per chunk of
    tensors on a GPU, a loop on the CPU)."""

    def count(event) -> int:
        if event.name.startswith("aten::_foreach_"):
            return 1
        inner = sum(count(child) for child in event.cpu_children)
        if inner:
            return inner
        return int(event.name.startswith("aten::") and event.name not in NO_KERNEL)

    return sum(count(e) for e in events if e.cpu_parent is None)


def allocator_records(prof: profile) -> tuple[int, int, int]:
    """(start, peak, end): the bytes allocated at the profiled block's start, at their peak
    and at its end, from the CPU allocator's own records (``profile_memory``: each allocation
    and free with the allocator's running total, in order). The total is the allocator's
    over the process, so blocks profiled one after the other share one scale."""
    from torch._C._profiler import _EventType

    records: list[tuple[int, int, int]] = []

    def walk(event: Any) -> None:
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            records.append((event.start_time_ns, fields.alloc_size, fields.total_allocated))
        for child in event.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    if not records:
        return 0, 0, 0
    records.sort()
    return records[0][2] - records[0][1], max(r[2] for r in records), records[-1][2]


def measure_memory(setting: Setting, label: str, device: torch.device, seed: int) -> dict:
    """Kernels and peak memory of one arm's first step and of its second, in this (fresh)
    process, at the setting's ``memory_batch``: on CUDA the kernels launched and the maximum
    allocated (``torch.cuda.max_memory_allocated``); on the CPU :func:`kernel_count` and
    :func:`allocator_records` from each profiled step, and the peak resident set of the
    second (VmHWM, reset through /proc/self/clear_refs just before; ``ru_maxrss`` would carry
    the parent's peak across exec) with its rise over the set before. ``allocated_mb`` is the
    larger of the two steps' peaks (the first step included), both above the allocation at
    the first step's start; ``held_mb`` what the first step leaves allocated (gradients,
    optimizer state and whatever the arm keeps between steps)."""
    setting = dataclasses.replace(setting, batch=setting.memory_batch or setting.batch)
    arm = dict(arm_factories(setting, device, seed)[0])[label]()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    got: list[dict[str, float]] = []
    start: float | None = None  # MB allocated when the first step starts
    for _ in range(2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device) / 2**20
        else:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            before = _status_mb("VmRSS")
        with profile(activities=activities, profile_memory=device.type == "cpu") as prof:
            arm.step()
            _sync(device)
        events = list(prof.events())
        if device.type == "cuda":
            start = before if start is None else start
            peak = torch.cuda.max_memory_allocated(device) / 2**20
            end = torch.cuda.memory_allocated(device) / 2**20
            got.append({
                "kernels": sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events),
                "allocated_mb": peak - start, "held_mb": end - start,
                "peak_mb": peak, "rise_mb": peak - before,
            })
        else:
            began, top, end_bytes = (b / 2**20 for b in allocator_records(prof))
            start = began if start is None else start
            rss = _status_mb("VmHWM")
            got.append({"kernels": kernel_count(events), "allocated_mb": top - start,
                         "held_mb": end_bytes - start, "peak_mb": rss, "rise_mb": rss - before})
    first, later = got
    return {**later, "first_mb": first["allocated_mb"], "later_mb": later["allocated_mb"],
            "allocated_mb": max(first["allocated_mb"], later["allocated_mb"]),
            "held_mb": first["held_mb"]}


def memory_column(index: int, labels: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Each arm's kernels and memory (:func:`measure_memory`), each in its own subprocess
    (``--measure``); ``"failed"`` where the subprocess failed."""
    out = {}
    for label in labels:
        cmd = [sys.executable, __file__, "--measure", str(index), label, "--device", args.device,
               "--threads", str(args.threads), "--seed", str(args.seed)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = done.stdout.strip().splitlines()
        if done.returncode or not lines:
            out[label] = "failed"
            continue
        out[label] = json.loads(lines[-1])
    return out


def time_arms(
    arms: list[Arm],
    device: torch.device,
    *,
    warmup: int,
    budget_s: float,
    min_rounds: int,
    max_rounds: int,
    block_s: float,
    seed: int,
) -> tuple[int, dict[str, int]]:
    """Warm every arm up, then time rounds; returns (rounds, steps per block of each arm).

    Warm-up: ``warmup`` steps per arm (1 for arms slower than 0.5 s a step); the median of the
    warm-up steps after the first estimates the step time ``t``. An arm's block is
    ``max(1, round(block_s / t))`` consecutive steps (so a block of a fast arm spans several
    scheduler slices). The number of
    rounds is ``budget_s`` divided by the estimated cost of a round, clamped to
    ``[min_rounds, max_rounds]``. In each round every arm, in a fresh random order, runs one
    block; ``arm.times`` gets the block's per-step time.
    """
    estimate: dict[str, float] = {}
    for arm in arms:
        warm: list[float] = []
        for _ in range(warmup):
            _sync(device)
            t0 = time.perf_counter()
            arm.step()
            _sync(device)
            warm.append(time.perf_counter() - t0)
            if warm[0] > 0.5:
                break
        # the first step pays one-off costs; the median of the rest resists preemption
        estimate[arm.label] = statistics.median(warm[1:] or warm)
    inner = {a.label: max(1, round(block_s / estimate[a.label])) for a in arms}
    round_cost = sum(inner[a.label] * estimate[a.label] for a in arms)
    rounds = int(min(max_rounds, max(min_rounds, budget_s // max(round_cost, 1e-9))))
    order_rng = random.Random(seed)
    for _ in range(rounds):
        order = list(arms)
        order_rng.shuffle(order)
        for arm in order:
            k = inner[arm.label]
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(k):
                arm.step()
            _sync(device)
            arm.times.append((time.perf_counter() - t0) / k)
    return rounds, inner


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}" if seconds < 0.1 else f"{seconds * 1e3:.0f}"


SUMMARY_HEAD = (
    "| setting | dpsgd ÷ plain SGD (≤ 1.6×) | Opacus hooks ÷ dpsgd (≥ 20×) "
    "| Opacus hooks ÷ plain (issue: ~80×) | ≥ 20× needs dpsgd ≤ | noise draw ÷ plain "
    "| hand-written minimal DP-SGD ÷ plain | dpsgd ÷ hand-written (≤ 1.15×) "
    "| nonprivate ÷ plain | slowest fast-path method ÷ plain |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def table(
    arms: list[Arm], inner: dict[str, int], memory: dict[str, str] | None = None
) -> tuple[str, dict[str, float | str]]:
    """Markdown table of one setting, and the key ratios for the target check."""
    by = {a.label: a for a in arms}
    plain = by[PLAIN].median
    hooks = by[OPACUS].median if OPACUS in by else math.nan
    mem_head, mem_rule = (
        " kernels / step | peak allocated, MB: step 1 / step 2 | held after step 1 (MB) "
        "| peak RSS, MB: rise (total) |", "---:|---:|---:|---:|"
    ) if memory else ("", "")
    lines = [
        "| arm | median step (ms) | IQR (ms) | × plain SGD | Opacus hooks ÷ arm | steps / block |"
        + mem_head,
        "|---|---:|---:|---:|---:|---:|" + mem_rule,
    ]
    for arm in arms:
        qs = statistics.quantiles(arm.times, n=4) if len(arm.times) > 1 else [arm.median] * 3
        name = arm.label if arm.kind == "method" else f"*{arm.label}*"
        lines.append(
            f"| {name} | {_ms(arm.median)} | {_ms(qs[0])}–{_ms(qs[2])} | "
            f"{arm.median / plain:.2f} | {hooks / arm.median:.1f} | {inner[arm.label]} |"
            + (f" {_memory_cells(memory.get(arm.label))} |" if memory else "")
        )
    fast = [
        a for a in arms
        if a.kind == "method" and a.label not in ("bam", MATERIALIZED[0], BAM_MATERIALIZED[0])
    ]
    slowest = max(fast, key=lambda a: a.median)
    key: dict[str, float | str] = {
        "clip_vs_plain": by[CLIP_RULE].median / plain,
        "hooks_vs_clip": hooks / by[CLIP_RULE].median,
        "hooks_vs_plain": hooks / plain,
        "ghost_vs_plain": by[OPACUS_GHOST].median / plain if OPACUS_GHOST in by else math.nan,
        "noise_vs_plain": by[NOISE].median / plain,
        "handwritten_vs_plain": (
            f"{by[HANDWRITTEN].median / plain:.2f}×" if HANDWRITTEN in by else "n/a (MLP only)"
        ),
        "nonprivate_vs_plain": (
            by["nonprivate"].median / plain if "nonprivate" in by else math.nan
        ),
        "clip_vs_handwritten": (
            by[CLIP_RULE].median / by[HANDWRITTEN].median if HANDWRITTEN in by else math.nan
        ),
        "slowest_fast": f"{slowest.label} {slowest.median / plain:.2f}×",
        "materialized_vs_plain": (
            by[MATERIALIZED[0]].median / plain if MATERIALIZED[0] in by else math.nan
        ),
    }
    return "\n".join(lines), key


def _memory_cells(got: Any) -> str:
    """The kernel and memory cells of one arm (:func:`measure_memory`)."""
    if not isinstance(got, dict):
        return "n/a | n/a | n/a | n/a"
    return (f"{got['kernels']} | {got['first_mb']:.0f} / {got['later_mb']:.0f} | "
            f"{got['held_mb']:.0f} | {got['rise_mb']:.0f} ({got['peak_mb']:.0f})")


MEMORY_NOTE = (
    "kernels: aten ops doing work in the second profiled step (views and allocations left out, "
    "a composite op counted by its parts); peak allocated: the bytes allocated above the "
    "step's start at their peak, from the CPU allocator's own records (each allocation and "
    "free with its running total, torch.profiler's profile_memory), for a fresh process's "
    "first step and its second (the larger is the arm's figure); held after step 1: what "
    "that step leaves allocated; peak RSS: VmHWM reset just before the second step (the "
    "allocator may keep freed pages)"
)
ARCH_HEAD = (
    "| setting | dpsgd ÷ plain | Opacus hooks ÷ plain | Opacus ghost ÷ plain "
    "| dpsgd faster than Opacus hooks | kernels / step: plain / dpsgd / Opacus ghost "
    "(dpsgd ÷ plain, target ≤ 2×) | peak allocated, MB: plain / dpsgd / Opacus ghost "
    "(dpsgd ÷ ghost, target ≤ 1×) |\n"
    "|---|---|---|---|---|---|---|"
)


def arch_row(label: str, key: dict, memory: dict[str, Any] | None) -> str:
    """One row of the engine summary: the ratios, and the kernels and memory of the key arms."""
    got = {arm: (memory or {}).get(arm) for arm in (PLAIN, CLIP_RULE, OPACUS_GHOST)}

    def column(field: str, fmt: str, over: str) -> str:
        if not all(isinstance(g, dict) for g in got.values()):
            return "n/a"
        values = [g[field] for g in got.values()]  # type: ignore[index]
        ratio = values[1] / (values[0] if over == PLAIN else values[2])
        return " / ".join(format(v, fmt) for v in values) + f" ({ratio:.2f}×)"

    faster = key["hooks_vs_clip"]
    verdict = "n/a" if math.isnan(faster) else f"{faster:.2f}× ({'yes' if faster > 1 else 'NO'})"

    def ratio(name: str) -> str:
        return "n/a" if math.isnan(key[name]) else f"{key[name]:.2f}×"

    return (
        f"| {label} | {ratio('clip_vs_plain')} | {ratio('hooks_vs_plain')} "
        f"| {ratio('ghost_vs_plain')} | {verdict} | {column('kernels', 'd', PLAIN)} "
        f"| {column('allocated_mb', '.0f', OPACUS_GHOST)} |"
    )


def thread_check(steps: int = 10) -> str:
    """Median plain-SGD step of the Adult-sized MLP (random batch of 256) at 1 and 2 threads:
    on a machine whose cores are all busy, OpenMP's barriers make 2 threads far slower."""
    x = torch.randn(256, 98, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 2, (256,), generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    out = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        arm = plain_arm(
            build_model(parse_model_config({"name": "mlp"}), (98,), 2), x, y
        )
        arm.step()
        for _ in range(steps):
            t0 = time.perf_counter()
            arm.step()
            arm.times.append(time.perf_counter() - t0)
        out.append(f"{threads} thread{'s' if threads > 1 else ''}: {_ms(arm.median)} ms")
    torch.set_num_threads(before)
    return ", ".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run, not a result")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument(
        "--budget", type=float, default=None,
        help="seconds of timed rounds per setting (default 100; quick 10)",
    )
    p.add_argument("--min-rounds", type=int, default=None, help="default 7; quick 3")
    p.add_argument("--max-rounds", type=int, default=60)
    p.add_argument("--block", type=float, default=0.05, help="target seconds of one block")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps per arm (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--settings", nargs="*", type=int, default=None,
        help="indices of the settings to run (0: MLP B=256, 1: MLP B=2048, 2: CNN, "
        "3: transformer, 4: WideResNet); default all",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--memory", action="store_true",
        help="add each arm's peak memory, measured in a subprocess per arm",
    )
    p.add_argument("--measure", nargs=2, metavar=("SETTING", "ARM"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budget = args.budget or (10.0 if args.quick else 100.0)
    min_rounds = args.min_rounds or (3 if args.quick else 7)
    warmup = args.warmup or (2 if args.quick else 5)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    device = torch.device(args.device)
    # Opacus warns about secure_mode and about hooks on every GradSampleModule: noise here.
    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    if args.measure:
        torch.set_num_threads(args.threads)
        index, label = args.measure
        print(json.dumps(measure_memory(SETTINGS[int(index)], label, device, args.seed)))
        return 0
    started = dt.datetime.now(dt.UTC)
    load_start = load_average()
    t_start = time.perf_counter()
    threads_note = thread_check() if device.type == "cpu" else "n/a (GPU)"
    print(f"plain SGD step of the MLP, B=256: {threads_note}", flush=True)
    torch.set_num_threads(args.threads)
    indices = args.settings if args.settings else list(range(len(SETTINGS)))

    sections: list[str] = []
    summary: list[str] = []
    arch: list[str] = []
    for index in indices:
        setting = SETTINGS[index]
        t0 = time.perf_counter()
        arms, info = build_arms(setting, device, args.seed)
        rounds, inner = time_arms(
            arms, device, warmup=warmup, budget_s=budget, min_rounds=min_rounds,
            max_rounds=args.max_rounds, block_s=args.block, seed=args.seed,
        )
        measured = [a.label for a in arms if a.label in (setting.memory_arms or [a.label])]
        memory = memory_column(index, measured, args) if args.memory else None
        text, key = table(arms, inner, memory)
        skipped = "".join(
            f"\n\n*{label}* could not run this model: `{why}`"
            for label, why in info["skipped"].items()
        )
        arch.append(arch_row(setting.label, key, memory))
        elapsed = time.perf_counter() - t0
        load_now = load_average()
        print(f"\n## {setting.label} ({elapsed:.0f} s, {rounds} rounds)\n{text}", flush=True)
        sections.append(
            f"### {setting.label}\n\n"
            f"Input {info['input_shape']}, {info['n_classes']} classes, {info['n_groups']} "
            f"groups, {info['n_params']:,} parameters; {rounds} rounds, {elapsed:.0f} s for "
            f"this setting; load average after it {load_now}.{skipped}\n\n{text}\n"
        )
        met_plain = key["clip_vs_plain"] <= 1.6
        met_hooks = key["hooks_vs_clip"] >= 20
        target = setting.tabular_binary  # the target is stated for the MLP
        summary.append(
            f"| {setting.label} | {key['clip_vs_plain']:.2f}×"
            + (f" ({'met' if met_plain else 'NOT met'})" if target else "")
            + f" | {key['hooks_vs_clip']:.1f}×"
            + (f" ({'met' if met_hooks else 'NOT met'})" if target else "")
            + f" | {key['hooks_vs_plain']:.1f}× | {key['hooks_vs_plain'] / 20:.2f}× plain"
            + f" | {key['noise_vs_plain']:.2f}× | {key['handwritten_vs_plain']}"
            + (" | n/a" if math.isnan(key["clip_vs_handwritten"]) else
               f" | {key['clip_vs_handwritten']:.2f}×"
               f" ({'met' if key['clip_vs_handwritten'] <= 1.15 else 'NOT met'})")
            + f" | {key['nonprivate_vs_plain']:.2f}×"
            + f" | {key['slowest_fast']} |"
        )
    total = time.perf_counter() - t_start
    load_end = load_average()

    gpu_note = (
        f"GPU: {torch.cuda.get_device_name(device)}."
        if device.type == "cuda"
        else "GPU: none in this run (CPU only; no GPU was available when this file was "
        "written). `--device cuda` runs the same benchmark on a GPU, synchronising around "
        "every timed block."
    )
    header = f"""# Step time of every method (benchmarks/step_speed.py)

Written by `benchmarks/step_speed.py{' --quick' if args.quick else ''}` on
{started:%Y-%m-%d %H:%M} UTC; total run time {total:.0f} s.

**Machine.** CPU {cpu_model()}, {os.cpu_count()} logical cores visible, torch
{torch.__version__}, Opacus {opacus.__version__}, Python {platform.python_version()},
`torch.set_num_threads({args.threads})`, device `{device}`.
{gpu_note}
Load average (1/5/15 min) at start {load_start}, at end {load_end}: the cores are shared
with other workers, so absolute times carry that load (and scheduler slices of a few ms make
single steps of the fast arms jumpy); the arms run round-robin in a fresh random order every
round, so load changes hit all alike, and the ratios are the robust numbers.
Why one thread: the median plain SGD step of the MLP (B=256) measured at the start of this run
was {threads_note}. With every core busy, OpenMP's barriers wait for a descheduled peer thread,
so more threads than free cores is far slower, not faster.

**Protocol.** One real batch per setting (B rows of a seeded shuffle of the training split),
one initialised model copied into every arm, SGD with lr {LR}, σ = {SIGMA}, C = 1 (otherwise the
method's default constants). {warmup} warm-up steps per arm (1 for arms slower than 0.5 s),
the median of those after the first estimating the step time; an arm's *block* is as many
consecutive full steps (gradient + `optimizer.step()`) as fill ~{args.block * 1e3:.0f} ms
(at least 1). Then rounds (as many as fit {budget:.0f} s, at least {min_rounds}): in each
round every arm, in a fresh random order, runs one block and records its per-step time.
Table: median over rounds, interquartile range, ratio to the *plain SGD* step
(`loss.mean().backward(); opt.step()`, no per-sample machinery), and how many times faster
the arm is than the Opacus hooks step. Reference arms are in italics. `nonprivate` is
dpfair's `NonPrivate` method through `PrivateStep` (one ordinary backward, no per-sample
work). `bam` forms per-sample *ascended* gradients: two ghost-clipping passes with per-sample
output shifts (`dpfair.engine.ascent`; materialised on other layers);
`bam (materialized engine)` is BAM on the vmap path; `dpsgd (materialized engine)` is dpsgd
on the torch.func vmap reference engine;
`fairlens` adds two double-backward passes (Hessian-vector products) for its batch
regularisers. `Opacus ghost clipping` is Opacus's own fast
path (`GradSampleModuleFastGradientClipping`), for information. `noise draw alone` is the
Gaussian draw of one private step (one normal per parameter from a seeded torch generator)
and nothing else: no private step can cost less than the plain step plus this draw.
`hand-written minimal DP-SGD` (MLP only) is DP-SGD for exactly this MLP written out with no
engine, method object or checks (forward, one backward to the layer outputs, ghost norms,
one noise draw, one `addmm_` per layer into it): what dpfair's abstractions cost on top.

**Target** (issue "DP training engine"): on the MLP a clip-rule method's step (dpsgd) ≤ 1.6×
the non-private step and ≥ 20× faster than Opacus hooks (verdicts on the MLP rows only).
The issue derived the second from hooks being ~80× the plain step; where hooks is only h×
the plain step, 20× asks for a dpsgd step of at most h/20 × plain (column "≥ 20× needs"),
which is below 1 + (noise draw ÷ plain) whenever h < 20 (1 + noise ÷ plain).

{SUMMARY_HEAD}
"""
    arch_text = f"""**Engine** (issues #18 and #29): each setting's dpsgd step against plain
SGD and Opacus, and with `--memory` (one subprocess per arm, at the batch the setting names)
each arm's kernels and memory ({MEMORY_NOTE if device.type == "cpu" else
"CUDA kernels launched and max allocated"}; "n/a" without it). Issue #29's CPU proxies: the
WideResNet's dpsgd kernels ≤ 2× plain's and its peak allocated memory ≤ Opacus ghost
clipping's; the MLP's dpsgd step ≤ 1.15× the hand-written one (summary above). GPU targets
(verified on a GPU only): WideResNet ≤ 2.0× plain with memory ≤ Opacus ghost, transformer
≤ 2.0× in fp32, Adult MLP ≤ 1.6×, BAM ≤ 3× and FairLens ≤ 5×. The 3×16×16 WideResNet and
the small transformer are scaled down for the CPU; the two GPU-sized settings (issue: B = 1024
and B = 64) are timed at a small batch and measured at the named one.

{ARCH_HEAD}
""" + "\n".join(arch) + "\n\n"
    body = header + "\n".join(summary) + "\n\n" + arch_text + "\n".join(sections)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(body)
    print(f"\nwrote {args.out} ({total:.0f} s; load {load_start} -> {load_end})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
