"""A CPU tuning run: dpsgd and bounded_adaptive on Dutch, TNB search, 1 and 2 workers.

For each method, the same private search (README: "Private tuning") is run twice, once with one
worker in this process and once with two worker processes sharing an Optuna journal file in a
temporary directory. Both runs use the same tuning seed in ``reproducible`` mode, so they draw
the same K and the same configurations (draws are reseeded per trial number): the two runs do
the same work and their wall times compare the worker counts directly.

Setting: Dutch (sex groups), softmax/logistic regression (``{"name": "logistic_regression"}``),
Zhao et al.'s normalised clipping (``dpsgd`` with ``normalize: true``, her constant baseline)
and her lower-bounded adaptive clipping (``bounded_adaptive``, initial bound 1 and her fixed
``gamma = 0.5, tau = 2.5, eta_C = 0.2, sigma_count = 10 sigma``), batch size 256 (Esipova's
Dutch setting; Zhao's 10,000 would leave 15 steps in 3 epochs), 3 epochs instead of her 40,
sigma = 1, delta = 1e-6. The space is a reduced version of her
grids (published.yaml, ``zhao_bounded_adaptive.settings``): every other learning rate of her
10 and every third clip value of her 20 for ``C`` (dpsgd); for ``bounded_adaptive`` the lower
bound ``C_LB`` from the bottom of her clip grid (0.001 to 0.0098, the values below
``BoundedAdaptiveConfig``'s default C_LB = 0.01).

Records, per method and worker count: K, the chosen configuration and its noisy validation
macro accuracy, epsilon of one training run and of the whole search (Papernot & Steinke's
``RepeatAndSelectDpEvent``), wall time, trials per hour, and the median trial duration from the
study's own timestamps.

    .venv/bin/python benchmarks/tuning_bench.py            # the recorded run (~5 min)
    .venv/bin/python benchmarks/tuning_bench.py --help

Writes benchmarks/results/tuning.md (``--out`` to change). ``--accounting-only`` rewrites only
its accounting section (:func:`accounting_section`: each setting's search ε under RDP alone
and under the tightest valid accountant, no training).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch
from machine import cpu_model, load_average
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from dpfair import accounting
from dpfair.data import load_dataset
from dpfair.training import TrainConfig
from dpfair.tuning import TuningConfig, TuningResult, draw_k, planned_run_event, search_event, tune

ROOT = Path(__file__).resolve().parent
DEFAULT_OUT = ROOT / "results" / "tuning.md"

#: Zhao et al. App. A.4 grids (published.yaml) and the reduced grids used here.
ZHAO_LR = [1.0, 1.2915, 1.6681, 2.1544, 2.7826, 3.5938, 4.6416, 5.9948, 7.7426, 10.0]
ZHAO_CLIP = [0.0010, 0.0018, 0.0031, 0.0055, 0.0098, 0.0172, 0.0305, 0.0539, 0.0952, 0.1682,
             0.2973, 0.5254, 0.9285, 1.6409, 2.9000, 5.1252, 9.0579, 16.0082, 28.2915, 50.0]
LR_GRID = ZHAO_LR[::2]
SPACES: dict[str, dict[str, list[Any]]] = {
    "dpsgd": {"lr": LR_GRID, "C": ZHAO_CLIP[::3]},
    "bounded_adaptive": {"lr": LR_GRID, "C_LB": [c for c in ZHAO_CLIP if c < 0.01]},
}
METHODS: dict[str, dict[str, Any]] = {
    "dpsgd": {"name": "dpsgd", "C": 1.0, "normalize": True},
    "bounded_adaptive": {"name": "bounded_adaptive", "C0": 1.0},
}


@dataclass
class RunRecord:
    """One search: ``method`` with ``workers`` worker processes."""

    method: str
    workers: int
    result: TuningResult
    wall_s: float
    trial_s: list[float]
    span_s: float  # first trial start to last trial end, from the study's timestamps
    cpu_s: float  # CPU time (user + system) of this process and its worker processes

    @property
    def trials_per_hour(self) -> float:
        return 3600.0 * self.result.n_runs / self.wall_s

    @property
    def trials_per_hour_span(self) -> float:
        return 3600.0 * self.result.n_runs / self.span_s if self.span_s > 0 else float("nan")


def trial_durations(storage_path: Path, study_name: str) -> tuple[list[float], float]:
    """Seconds each finished trial took, and the span from the first start to the last end,
    from the journal's own timestamps."""
    storage = JournalStorage(JournalFileBackend(str(storage_path)))
    study = optuna.load_study(study_name=study_name, storage=storage)
    done = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.datetime_start is not None and t.datetime_complete is not None
    ]
    if not done:
        return [], 0.0
    durations = [(t.datetime_complete - t.datetime_start).total_seconds() for t in done]
    first = min(t.datetime_start for t in done)
    last = max(t.datetime_complete for t in done)
    return durations, (last - first).total_seconds()


def run_search(
    method: str,
    workers: int,
    dataset: Any,
    train_base: dict[str, Any],
    args: argparse.Namespace,
    tmp: Path,
) -> RunRecord:
    """One TNB search of ``method`` with ``workers`` workers on a fresh journal file."""
    journal = tmp / f"{method}-w{workers}.journal"
    study_name = f"bench-{method}-w{workers}"
    cfg = TuningConfig(
        mode="tnb",
        eta=args.eta,
        mu=args.mu,
        space=SPACES[method],
        score="macro_accuracy",
        score_privacy="noisy",
        storage=f"journal:{journal}",
        study_name=study_name,
        seed=args.seed,
        reproducible=True,  # the same K for every worker count (see report)
        workers=workers,
    )
    base = TrainConfig.model_validate({**train_base, "method": METHODS[method]})
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    result = tune(base.method, base, dataset, cfg)
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    durations, span = trial_durations(journal, study_name)
    return RunRecord(method, workers, result, wall, durations, span, cpu)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its finished child processes."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def report(records: list[RunRecord], args: argparse.Namespace, meta: dict[str, str]) -> str:
    """The markdown of ``benchmarks/results/tuning.md``."""
    rows = [
        "| method | workers | K | runs | chosen configuration | noisy val. macro acc. | "
        "ε training | ε with search | wall (s) | trials / h | trials / h, trials only | "
        "median trial (s) | cores obtained |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        res = r.result
        chosen = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted((res.best_params or {}).items()))
        score = f"{res.best_score:.3f}" if res.best_score is not None else "—"
        med = f"{statistics.median(r.trial_s):.1f}" if r.trial_s else "—"
        rows.append(
            f"| {r.method} | {r.workers} | {res.K} | {res.n_runs} | {chosen or '—'} | {score} | "
            f"{res.epsilon_training:.3f} | {res.epsilon_search:.3f} | {r.wall_s:.0f} | "
            f"{r.trials_per_hour:.0f} | {r.trials_per_hour_span:.0f} | {med} | "
            f"{r.cpu_s / r.wall_s:.2f} |"
        )
    speedups = []
    for method in METHODS:
        by = {r.workers: r for r in records if r.method == method}
        if 1 in by and 2 in by:
            same = by[1].result.best_params == by[2].result.best_params
            cores = [by[w].cpu_s / by[w].wall_s for w in (1, 2)]
            cpu_per_run = [by[w].cpu_s / max(by[w].result.n_runs, 1) for w in (1, 2)]
            reading = (
                f"the 2 workers together obtained {cores[1]:.2f} cores against {cores[0]:.2f} "
                "for 1 worker"
                + (
                    " — no more CPU than one worker got, so the other work on the machine, not "
                    "the search, bounded the speed-up"
                    if cores[1] < 1.3 * cores[0]
                    else ""
                )
                + f"; CPU per run {cpu_per_run[0]:.1f} s (1 worker) vs {cpu_per_run[1]:.1f} s "
                "(2 workers: each worker process pays its own start-up, see the notes)"
            )
            speedups.append(
                f"* {method}: 2 workers / 1 worker = "
                f"{by[2].trials_per_hour / by[1].trials_per_hour:.2f}× trials per hour "
                f"({by[2].trials_per_hour_span / by[1].trials_per_hour_span:.2f}× counting "
                "the trials only) "
                f"(same K = {by[1].result.K}, same configurations; best configuration "
                f"{'identical' if same else 'differs'}); {reading}."
            )
    spaces = "\n".join(
        f"* {m}: " + ", ".join(f"`{k}` ∈ {v}" for k, v in SPACES[m].items())
        + f" ({'×'.join(str(len(v)) for v in SPACES[m].values())} = "
        f"{_grid_size(SPACES[m])} configurations)"
        for m in METHODS
    )
    return f"""# CPU tuning run: dpsgd and bounded_adaptive on Dutch (benchmarks/tuning_bench.py)

Written by `benchmarks/tuning_bench.py` on {meta['date']} UTC; total {meta['total']} s.

**Machine.** CPU {cpu_model()}, {os.cpu_count()} logical cores (shared with other workers),
torch {torch.__version__}, Optuna {optuna.__version__}, Python {platform.python_version()}.
One torch thread per worker (`OMP_NUM_THREADS=1`, `torch.set_num_threads(1)`), so two
workers use the two cores; the cores are shared with other processes, so the 2-worker
speed-up is bounded by the load (load average, 1/5/15 min, at start {meta['load_start']},
at end {meta['load_end']}; with 2 cores, above 2 means other work competed for them).

**Search.** `tnb` mode, η = {args.eta}, μ = {args.mu}: K ~ truncated negative binomial, drawn
once per study from tuning seed {args.seed} (`reproducible: true`, so both worker counts draw
the same K; the configurations depend only on (seed, n) in every mode). Each run draws
every hyperparameter uniformly with replacement from the grid; selection by macro accuracy on
the validation split, released with Gaussian noise (σ_score = 10, the default `score_privacy:
noisy`), composed into the run event. Storage: Optuna journal file in a temporary directory
(removed afterwards); 2 workers are two `python -m dpfair.tuning worker` processes.
The seed was chosen (see `--seed`) so that K is large enough to measure throughput: choosing a
seed by its K is a redraw of K and would void the TNB guarantee in a real search — it is done
here only because this is a speed benchmark.

**Training.** Dutch ({meta['n_train']} training rows after the 10% validation split),
`logistic_regression`, {args.epochs} epochs (Zhao: 40), expected batch size
{args.batch_size} (Esipova's Dutch batch; Zhao's 10,000 would give only 15 steps in 3 epochs),
Poisson sampling, SGD, σ = {args.sigma}, δ = {args.delta}. dpsgd is normalised clipping (De et al.;
Zhao's constant baseline); bounded_adaptive has C0 = 1, γ = 0.5, τ = 2.5, η_C = 0.2,
σ_count = 10σ (Zhao's fixed values). Reduced grids (Zhao: 10 learning rates × 20 clip values):

{spaces}

ε of one training run (the chosen configuration's, the same for every configuration here) and
of the whole search (`RepeatAndSelectDpEvent(run ∘ score, μ, η)`), at δ = {args.delta}.

| | |
|---|---|
{chr(10).join(speedups_rows(records))}

{chr(10).join(rows)}

{chr(10).join(speedups)}

Notes: *trials / h* = runs / wall time of the whole `tune` call (for 2 workers this includes
starting two Python processes that import torch and unpickle the job: a cProfile of one
worker process running all 25 dpsgd runs alone on this machine took 41 s, of which ~11 s
imports, ~4 s unpickling the job with its dataset and ~3 s importing `torch._dynamo` when the
first optimizer is built, against 31 s of training; storage calls were negligible);
*trials / h, trials only* = runs / (last trial end − first trial start) from the study's
timestamps, which excludes most of that start-up; the median trial duration (start
to complete of each trial, also from the study) includes each run's noisy validation score;
*cores obtained* = CPU seconds (user + system, this process and its worker processes) per
wall-clock second of the `tune` call: how much of the 2 cores the search actually got. With
other work on the machine, 2 workers speed the search up only as far as they obtain more than
the 1 worker did.
"""


def speedups_rows(records: list[RunRecord]) -> list[str]:
    """Header summary rows: total wall time per worker count."""
    out = []
    for w in (1, 2):
        rs = [r for r in records if r.workers == w]
        if rs:
            runs = sum(r.result.n_runs for r in rs)
            wall = sum(r.wall_s for r in rs)
            out.append(
                f"| {w} worker{'s' if w > 1 else ''} | {runs} runs in {wall:.0f} s: "
                f"{3600 * runs / wall:.0f} trials / h |"
            )
    return out


def _grid_size(space: dict[str, list[Any]]) -> int:
    n = 1
    for v in space.values():
        n *= len(v)
    return n


ACCOUNTING_HEADING = "## Accounting: the search's ε under RDP and under the tightest accountant"


def accounting_section(dataset: Any, train_base: dict[str, Any], args: argparse.Namespace
                       ) -> str:
    """Each method's search at this file's setting (and a few other laws of K): ε of the
    search (``RepeatAndSelectDpEvent(run ∘ score, μ, η)``) by RDP alone (Papernot & Steinke)
    and by :func:`dpfair.accounting.accountant.spend` (the privacy-profile bound of Koskela et
    al. on the run's PLD, or RDP where smaller), at ``args.delta``."""
    rows = ["| method | law of K | ε one run: RDP | ε one run: tightest | ε search: RDP | "
            "ε search: tightest | tightest / RDP | accountant |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    laws = [("tnb", args.eta, args.mu), ("tnb", 0.0, args.mu), ("poisson", 0.0, args.mu),
            ("tnb", 1.0, 3.0)]
    for method in METHODS:
        base = TrainConfig.model_validate({**train_base, "method": METHODS[method]})
        run = planned_run_event(base, dataset)
        for mode, eta, mu in laws:
            cfg = TuningConfig(mode=mode, eta=eta, mu=mu, score_privacy="noisy")
            event = search_event(cfg, run)
            rdp, tight = accounting.rdp_epsilon(event, args.delta), accounting.spend(event,
                                                                                     args.delta)
            law = f"TNB η={eta:g} μ={mu:g}" if mode == "tnb" else f"Poisson μ={mu:g}"
            rows.append(f"| {method} | {law} | {accounting.rdp_epsilon(run, args.delta):.3f} | "
                        f"{accounting.epsilon(run, args.delta):.3f} | {rdp:.3f} | "
                        f"{tight.epsilon:.3f} | {tight.epsilon / rdp:.3f} | {tight.accountant} |")
    return "\n".join([
        ACCOUNTING_HEADING, "",
        f"Computed by `benchmarks/tuning_bench.py --accounting-only` on "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC from the planned events of this file's "
        f"setting (σ = {args.sigma:g}, batch {args.batch_size}, {args.epochs} epochs, noisy "
        f"score σ_score = 10, δ = {args.delta:g}); no training. The first row of each method is "
        "the search recorded above; the others change only the law of K.", "", *rows, ""])


def _replace_accounting(path: Path, section: str) -> str:
    """``path``'s text with its accounting section replaced by ``section`` (or appended)."""
    text = path.read_text() if path.exists() else ""
    head = text.split(ACCOUNTING_HEADING)[0].rstrip("\n")
    return (head + "\n\n" if head else "") + section


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--workers", nargs="*", type=int, default=[1, 2])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--eta", type=float, default=1.0, help="TNB shape (1 = geometric)")
    p.add_argument("--mu", type=float, default=10.0, help="mean number of runs")
    p.add_argument("--seed", type=int, default=14, help="tuning seed (draws K and every config)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--accounting-only", action="store_true",
                   help="rewrite only the accounting section (no search is run)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the worker processes
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's RDP-order notices
    started = dt.datetime.now(dt.UTC)
    load_start = load_average()
    t_start = time.perf_counter()
    dataset = load_dataset("dutch")
    train_base = {
        "model": {"name": "logistic_regression"},
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "sigma": args.sigma,
        "delta": args.delta,
        "device": "cpu",
        "progress": False,
    }
    if args.accounting_only:
        args.out.write_text(_replace_accounting(
            args.out, accounting_section(dataset, train_base, args)))
        print(f"wrote the accounting section of {args.out}")
        return 0
    k = draw_k(
        TuningConfig(mode="tnb", eta=args.eta, mu=args.mu, seed=args.seed, reproducible=True), 1
    )
    print(f"K = {k} (eta {args.eta}, mu {args.mu}, seed {args.seed})", flush=True)
    records: list[RunRecord] = []
    with tempfile.TemporaryDirectory(prefix="dpfair-tuning-bench-") as tmp:
        for method in args.methods:
            for workers in args.workers:
                rec = run_search(method, workers, dataset, train_base, args, Path(tmp))
                records.append(rec)
                print(
                    f"{method} workers={workers}: K={rec.result.K} runs={rec.result.n_runs} "
                    f"best={rec.result.best_params} eps_train={rec.result.epsilon_training:.3f} "
                    f"eps_search={rec.result.epsilon_search:.3f} wall={rec.wall_s:.1f}s "
                    f"({rec.trials_per_hour:.0f}/h)",
                    flush=True,
                )
    total = time.perf_counter() - t_start
    meta = {
        "date": f"{started:%Y-%m-%d %H:%M}",
        "total": f"{total:.0f}",
        "load_start": load_start,
        "load_end": load_average(),
        "n_train": f"{len(dataset.train):,}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(records, args, meta) + "\n"
                        + accounting_section(dataset, train_base, args))
    print(f"wrote {args.out} ({total:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
