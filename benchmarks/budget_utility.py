"""Utility at a fixed total ε: noise calibrated under RDP alone vs the tightest valid accountant.

The release: a private search (TNB, η = 1, μ = 5, each run's noisy validation score with
σ_score = 10σ) and the final run on each of 3 seeds, all on Adult's training rows, must spend
ε 3 in total at δ 1e-5. Budget-first planning (:func:`dpfair.accounting.calibration.
noise_scale_for_budget`) finds the one noise factor that meets it, once with RDP alone (the
old accountant: Papernot & Steinke for the search) and once with the tightest valid accountant
(PLD for the runs, the privacy-profile bound for the search). The final models are then
trained at each calibrated σ on the same 3 seeds with the same fixed configuration, and their
worst-group and per-group test accuracy compared. The search is accounted, not run: it would
select with the same noise in both arms, and running it K times per arm and seed is what this
benchmark is kept small to avoid.

    .venv/bin/python benchmarks/budget_utility.py     # a few minutes on 2 shared cores

Writes benchmarks/results/budget_utility.md (``--out`` to change).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import statistics
import time
from pathlib import Path

import torch
from dp_accounting import dp_event
from machine import cpu_model, load_average

from dpfair import accounting
from dpfair.accounting.calibration import scale_noise
from dpfair.data import load_dataset
from dpfair.training import TrainConfig, make_plan, train
from dpfair.tuning import TuningConfig, search_event

ROOT = Path(__file__).resolve().parent
DEFAULT_OUT = ROOT / "results" / "budget_utility.md"
SEEDS = (0, 1, 2)
TARGET, DELTA = 3.0, 1e-5


def release_event(config: TrainConfig, n_train: int, n_groups: int, sigma_score: float,
                  mu: float) -> dp_event.DpEvent:
    """The search (TNB η = 1, mean ``mu``, run ∘ score) and one final run per seed, composed."""
    run = make_plan(config, n_train, n_groups).event
    search = search_event(TuningConfig(mode="tnb", eta=1.0, mu=mu, sigma_score=sigma_score), run)
    return dp_event.ComposedDpEvent([search, *[run] * len(SEEDS)])


def calibrate(event: dp_event.DpEvent, rdp_only: bool) -> float:
    """The noise factor whose release meets TARGET, under RDP alone or the tightest figure."""
    eps = accounting.rdp_epsilon if rdp_only else accounting.epsilon
    lo, hi = 0.2, 20.0  # bisection in the factor: ε falls as the noise grows
    for _ in range(20):
        mid = (lo * hi) ** 0.5
        if eps(scale_noise(event, mid), DELTA) <= TARGET:
            hi = mid
        else:
            lo = mid
    return hi


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="adult")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--mu", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    started, load_start, t0 = dt.datetime.now(dt.UTC), load_average(), time.perf_counter()
    data = load_dataset(args.dataset)
    base = {"method": {"name": "dpsgd", "C": 1.0}, "model": {"name": "logistic_regression"},
            "epochs": args.epochs, "batch_size": 256, "lr": 0.5, "delta": DELTA,
            "device": "cpu", "progress": False}
    config = TrainConfig.model_validate({**base, "sigma": 1.0})
    event = release_event(config, len(data.train), data.n_groups, 10.0, args.mu)
    arms = {}
    for name, rdp_only in (("RDP alone", True), ("tightest (PLD + profile)", False)):
        factor = calibrate(event, rdp_only)
        scaled = scale_noise(event, factor)
        rows = []
        for seed in SEEDS:
            cfg = TrainConfig.model_validate({**base, "sigma": factor, "seed": seed})
            result = train(cfg, data)
            rows.append([float(a) for a in result.test_metrics["group_accuracy"]])
        arms[name] = {"sigma": factor, "rdp": accounting.rdp_epsilon(scaled, DELTA),
                      "tight": accounting.spend(scaled, DELTA), "groups": rows}
        print(name, f"sigma={factor:.4f}", [min(r) for r in rows], flush=True)
    lines = [
        "# Utility at a fixed total ε 3: RDP calibration vs the tightest valid accountant",
        "",
        f"Written by `benchmarks/budget_utility.py` on {started:%Y-%m-%d %H:%M} UTC; total "
        f"{time.perf_counter() - t0:.0f} s. Machine: {cpu_model()}, 2 logical cores shared "
        f"with other workers (load average at start {load_start}, at end {load_average()}).",
        "",
        f"Release: {args.dataset} ({len(data.train):,} training rows, {data.n_groups} groups "
        f"{', '.join(data.group_names)}), logistic regression, dpsgd C = 1, batch 256 "
        "(Poisson), lr 0.5, "
        f"{args.epochs} epochs; a TNB search (η = 1, μ = {args.mu:g}, noisy score σ_score = "
        f"10σ) accounted with the final run on seeds {', '.join(map(str, SEEDS))}; total ε "
        f"{TARGET:g} at δ = {DELTA:g}. One factor scales every noise (budget-first planning).",
        "The search is accounted, not run (see the module doc): both arms train the same fixed "
        "configuration, so the difference is the noise alone.",
        "",
        "| calibration | σ | total ε (its accountant) | total ε under RDP | worst-group acc. "
        "(mean ± sd) | " + " | ".join(f"acc. {g}" for g in data.group_names) + " |",
        "|---|---:|---|---:|---:|" + "---:|" * data.n_groups,
    ]
    for name, arm in arms.items():
        worst = [min(r) for r in arm["groups"]]
        per_group = [statistics.mean(r[g] for r in arm["groups"]) for g in range(data.n_groups)]
        lines.append(
            f"| {name} | {arm['sigma']:.4f} | {arm['tight'].epsilon:.3f} "
            f"({arm['tight'].accountant}) | {arm['rdp']:.3f} | "
            f"{100 * statistics.mean(worst):.2f} ± {100 * statistics.stdev(worst):.2f} | "
            + " | ".join(f"{100 * a:.2f}" for a in per_group) + " |")
    lines += ["", "Per seed, worst-group accuracy (%):", ""]
    for name, arm in arms.items():
        lines.append(f"* {name}: " + ", ".join(f"seed {s}: {100 * min(r):.2f}"
                                               for s, r in zip(SEEDS, arm["groups"], strict=True)))
    (r_name, r_arm), (t_name, t_arm) = arms.items()
    r_worst = [min(r) for r in r_arm["groups"]]
    t_worst = [min(r) for r in t_arm["groups"]]
    diff = 100 * (statistics.mean(t_worst) - statistics.mean(r_worst))
    spread = 100 * max(statistics.stdev(r_worst), statistics.stdev(t_worst))
    lines += ["", f"Reading: at the same total ε the tightest accountant needs "
              f"{1 - t_arm['sigma'] / r_arm['sigma']:.0%} less noise than RDP alone; the mean "
              f"worst-group accuracy differs by {diff:+.2f} points ("
              + ("within" if abs(diff) <= 2 * spread else "beyond")
              + f" twice the larger seed-to-seed s.d., {spread:.2f}). The RDP-calibrated "
              f"release in fact spends only ε {r_arm['tight'].epsilon:.3f} of the 3 by the "
              "tightest valid accountant."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
