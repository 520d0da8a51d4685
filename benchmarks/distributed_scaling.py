"""Throughput and memory per process of private training over 1 and 2 processes (issue
"private training across processes": ``dpfair.training.distributed``), beside Opacus's
``DifferentiallyPrivateDistributedDataParallel`` (DPDDP) on the same model.

Each arm is launched by dpfair's own launcher (torch's elastic launcher, the engine of
``torchrun``; gloo on the CPU): every process samples its shard of a synthetic training set
with rate q = B / n (Poisson, as ``dpfair.training`` does), runs the step, and the optimizer
steps. dpfair's step is :class:`~dpfair.engine.step.PrivateStep` (DPSGD, ghost clipping,
noise drawn once by process 0, one all-reduce); Opacus's is ``GradSampleModule(DPDDP(model))``
(hooks, materialised per-sample gradients) with ``DistributedDPOptimizer`` (noise on rank 0,
an all-reduce per parameter), on the same batches. After warm-up steps, ``steps`` steps are
timed between barriers on process 0: throughput = expected examples (``steps x B``) / time.
Memory: each process's peak RSS (``ru_maxrss``) at the end.

Threads: each process runs ``--threads`` torch threads (default 1), so 2 processes use twice
the cores of 1 (on cores shared with other work, more threads than free cores make OpenMP wait
for descheduled threads: benchmarks/results/step_speed.md). Settings: the Adult-sized MLP
(2 x 256 tanh, 104 inputs, B = 256) and WideResNet-16-4 with GroupNorm (3 x 16 x 16, B = 32).

    .venv/bin/python benchmarks/distributed_scaling.py           # the recorded run
    .venv/bin/python benchmarks/distributed_scaling.py --quick   # a smoke run

Writes benchmarks/results/distributed_scaling.md (``--out`` to change).
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import resource
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from arch_models import wide_resnet
from machine import cpu_model, load_average
from torch import nn

from dpfair.engine.step import PrivateStep
from dpfair.methods import DpsgdConfig, build_method
from dpfair.models import build_model
from dpfair.training.distributed import ProcessGroup, launch
from dpfair.training.loop import poisson_batch

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Setting:
    label: str
    model: str  # "mlp" or "wrn"
    n: int
    batch: int
    steps: int


SETTINGS = [
    Setting("MLP 2x256 tanh, 104 inputs, B=256", "mlp", 16384, 256, 40),
    Setting("WideResNet-16-4 (GroupNorm), 3x16x16, B=32", "wrn", 2048, 32, 8),
]


def _model(kind: str) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(0)
    if kind == "mlp":
        spec = {"name": "mlp", "hidden": [256, 256], "activation": "tanh"}
        from pydantic import TypeAdapter

        from dpfair.models import ModelConfig

        return build_model(TypeAdapter(ModelConfig).validate_python(spec), (104,), 2), (104,)
    return wide_resnet(), (3, 16, 16)


def _data(setting: Setting, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(setting.n, *shape, generator=gen)
    return x, torch.randint(0, 2, (setting.n,), generator=gen)


def _dpfair_step(model: nn.Module, setting: Setting, group: ProcessGroup):
    method = build_method(DpsgdConfig(C=1.0), n_groups=1, sigma=1.0,
                          expected_batch_size=float(setting.batch))
    step = PrivateStep(model, method, sigma=1.0, expected_batch_size=float(setting.batch),
                       collective=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    noise = torch.Generator()

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        step(x, y, torch.zeros(len(x), dtype=torch.long), noise)
        opt.step()

    return run


def _opacus_step(model: nn.Module, setting: Setting, group: ProcessGroup):
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from opacus.grad_sample import GradSampleModule
    from opacus.optimizers import DistributedDPOptimizer

    gsm = GradSampleModule(DPDDP(model))
    opt = DistributedDPOptimizer(
        torch.optim.SGD(gsm.parameters(), lr=0.01), noise_multiplier=1.0, max_grad_norm=1.0,
        expected_batch_size=setting.batch // group.world, loss_reduction="sum")
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        if len(x):
            loss_fn(gsm(x), y).backward()
        else:  # Opacus's optimizer needs a grad_sample: an empty step clips nothing
            for p in gsm.parameters():
                p.grad_sample = torch.zeros(0, *p.shape)
        opt.step()

    return run


def part(setting: Setting, arm: str, warmup: int, *, group: ProcessGroup) -> dict[str, Any]:
    """One process's share of an arm (run by the launcher): its throughput and peak RSS."""
    warnings.filterwarnings("ignore", message="Full backward hook")  # Opacus on an input layer
    model, shape = _model(setting.model)
    x, y = _data(setting, shape)
    shard = group.shard(setting.n)
    x, y = x[shard.start:shard.stop], y[shard.start:shard.stop]
    q = setting.batch / setting.n
    run = (_dpfair_step if arm == "dpfair" else _opacus_step)(model, setting, group)
    gen = torch.Generator().manual_seed(100 + group.rank)
    batches = [poisson_batch(len(x), q, gen) for _ in range(warmup + setting.steps)]
    for idx in batches[:warmup]:
        run(x[idx], y[idx])
    dist.barrier()
    started = time.perf_counter()
    for idx in batches[warmup:]:
        run(x[idx], y[idx])
    dist.barrier()
    seconds = time.perf_counter() - started
    peaks = torch.zeros(group.world, dtype=torch.float64)
    peaks[group.rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB
    group.sum_([peaks])
    return {"examples_per_s": setting.steps * setting.batch / seconds,
            "step_s": seconds / setting.steps, "peak_rss_mib": peaks.tolist(),
            "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each arm (alternating); the table gives the median")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed_scaling.md")
    args = parser.parse_args()
    started, load_start = dt.datetime.now(dt.UTC), load_average()
    rows = []
    for setting in SETTINGS:
        if args.quick:
            setting = Setting(setting.label, setting.model, setting.n, setting.batch, 2)
        for nproc in (1, 2):
            for arm in ("dpfair", "opacus"):
                found = [launch(part, (setting, arm, 1 if args.quick else 2), nproc=nproc,
                                device="cpu", threads=args.threads)
                         for _ in range(args.repeats)]
                rows.append((setting, nproc, arm, found))
                print(setting.label, nproc, arm, found, flush=True)
    write(args.out, rows, started, load_start)


def write(out: Path, rows: list, started: dt.datetime, load_start: str) -> None:
    seconds = (dt.datetime.now(dt.UTC) - started).total_seconds()
    lines = [
        "# Private training over processes: throughput and memory (benchmarks/"
        "distributed_scaling.py)", "",
        f"Written on {started:%Y-%m-%d %H:%M} UTC; total run time {seconds:.0f} s. "
        f"CPU {cpu_model()}, {torch.get_num_threads()} logical cores visible to torch, "
        f"torch {torch.__version__}, Python {platform.python_version()}, gloo. Load average "
        f"(1/5/15 min) at start {load_start}, at end {load_average()}: the cores are shared "
        "with other workers, so absolute figures carry that load; compare rows of one run.", "",
        "| setting | processes | arm | threads/process | examples/s (runs) | step (ms) | "
        "ratio to 1 process | peak RSS per process (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    def speed(found: list[dict]) -> float:
        return statistics.median(f["examples_per_s"] for f in found)

    one = {(s.label, arm): speed(found) for s, nproc, arm, found in rows if nproc == 1}
    for setting, nproc, arm, found in rows:
        arm_name = "dpfair (ghost, PrivateStep)" if arm == "dpfair" else "Opacus DPDDP (hooks)"
        each = " / ".join(f"{f['examples_per_s']:.0f}" for f in found)
        step = statistics.median(1000 * f["step_s"] for f in found)
        rss = ", ".join(f"{max(f['peak_rss_mib'][r] for f in found):.0f}" for r in range(nproc))
        lines.append(f"| {setting.label} | {nproc} | {arm_name} | {found[0]['threads']} | "
                     f"{speed(found):.0f} ({each}) | {step:.1f} | "
                     f"{speed(found) / one[(setting.label, arm)]:.2f} | {rss} |")
    lines += ["", "examples/s: the median of the runs (each run's in brackets); step: the "
              "median step time; ratio: this arm's examples/s over its own with 1 process; "
              "peak RSS: the largest of the runs, per process."]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
