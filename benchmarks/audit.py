"""Empirical privacy audit per group on Adult (sex): dpsgd, dpsgd_f, dpsgd_global_adapt and
fairlens, one training run each per canary kind (``dpfair.audit``, Steinke, Nasr & Jagielski
2023), the ε lower bound of each group beside the claimed ε.

Setting: Esipova et al.'s Adult (balanced, 14,000 per sex), MLP 2 x 256 tanh, batch 256,
σ = 1, δ = 1e-6, C = 0.5 and their methods' hyperparameters (benchmarks/configs/
01_esipova_adult.yaml), shortened to ``--epochs`` for a 2-core CPU.

    DPFAIR_DATA_MIRROR=/path/to/datasets .venv/bin/python benchmarks/audit.py
    .venv/bin/python benchmarks/audit.py --help

Writes benchmarks/results/audit.md and figures/audit_<method>_<kind>.png.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import torch
from machine import cpu_model, load_average

from dpfair.audit import AuditResult, AuditSettings, audit
from dpfair.audit.plot import score_figure
from dpfair.data import load_dataset
from dpfair.methods import Dpsgd, DpsgdConfig
from dpfair.training import TrainConfig

RESULTS = Path(__file__).parent / "results"
METHODS = {  # Esipova App. B.2 (01_esipova_adult.yaml): hyperparameters and learning rates
    "dpsgd": ({"name": "dpsgd", "C": 0.5}, 0.01),
    "dpsgd_f": ({"name": "dpsgd_f", "C0": 0.5, "sigma1": 10.0}, 0.01),
    "dpsgd_global_adapt": ({"name": "dpsgd_global_adapt", "C0": 0.5, "Z0": 50.0, "eta_Z": 0.1,
                            "tau": 1.0, "sigma2": 10.0}, 0.2),
    "fairlens": ({"name": "fairlens", "C": 0.5, "gamma1": 1.0, "gamma2": 1.0}, 0.01),
}
# Controls, not dpfair methods: the reference without any guarantee, and DPSGD with its
# clipping removed (the deliberate bug of tests/audit: it still claims DPSGD's ε).
CONTROLS = {
    "nonprivate (control)": ({"name": "nonprivate"}, 0.01),
    "dpsgd without clipping (broken control)": ({"name": "dpsgd", "C": 0.5}, 0.01),
}


class NoClipping(Dpsgd):
    """DPSGD's claim (sensitivity C) without its clipping (weights 1): a bug to catch."""

    def _weights(self, norms, groups):
        return torch.ones_like(norms), self.C


def _broken(label: str) -> mock._patch | nullcontext:
    if "broken" not in label:
        return nullcontext()
    return mock.patch.object(DpsgdConfig, "build", lambda self, ctx: NoClipping(self.C))


def run(args: argparse.Namespace) -> list[tuple[str, str, AuditResult, float]]:
    dataset = load_dataset("adult", {"protected": "sex", "balance_groups": True,
                                     "validation_fraction": 0.0, "seed": 0})
    out = []
    runs = [(label, kind) for label in args.methods for kind in args.kinds]
    if args.controls:
        runs += [("nonprivate (control)", "mislabel"),
                 ("dpsgd without clipping (broken control)", "gradient")]
    for label, kind in runs:
        method, lr = {**METHODS, **CONTROLS}[label]
        config = TrainConfig(method=method, model={"name": "mlp", "hidden": [256, 256],
                                                   "activation": "tanh"},
                             epochs=args.epochs, batch_size=256, lr=lr, sigma=1.0, delta=1e-6,
                             eval_every=args.epochs, progress=False)
        with _broken(label):
            started = time.perf_counter()
            result = audit(config, dataset, AuditSettings(canaries=args.canaries, kind=kind))
            seconds = time.perf_counter() - started
            name = label.split()[0] + ("_broken" if "broken" in label else "")
            score_figure(result, RESULTS / "figures" / f"audit_{name}_{kind}.png")
            print(label, kind, f"{seconds:.0f} s",
                  [(g.group, round(g.epsilon_lower_bound, 3)) for g in result.groups],
                  flush=True)
            out.append((label, kind, result, seconds))
    return out


def claimed(value: float | None) -> str:
    if value is None:
        return "heuristic — no DP guarantee"
    return "∞ (no guarantee)" if value == float("inf") else f"{value:.3f}"


def report(args: argparse.Namespace, found: list[tuple[str, str, AuditResult, float]]) -> str:
    first = found[0][2].train_result
    lines = [
        "# Empirical privacy audit per group: Adult (sex)", "",
        f"Produced by `benchmarks/audit.py` (`--epochs {args.epochs} --canaries "
        f"{args.canaries} --kinds {' '.join(args.kinds)}"
        f"{'' if args.controls else ' --no-controls'}`) on "
        f"{datetime.date.today().isoformat()}: {cpu_model()} ({platform.machine()}), "
        f"{torch.get_num_threads()} torch thread(s), load average {load_average()}; "
        f"{sum(s for *_, s in found) / 60:.1f} min in all.", "",
        "## Setting", "",
        f"* Data: Adult, protected attribute sex, balanced (Esipova: 14,000 per sex), "
        f"{first.n_train:,} training rows with the included canaries.",
        f"* Model and training: MLP 2 x 256 tanh, batch 256, σ = 1, δ = 1e-6, "
        f"{args.epochs} epochs ({first.steps} steps; Esipova trains 20), Esipova's C and "
        "learning rates (benchmarks/configs/01_esipova_adult.yaml). Secret noise and batches "
        "(the default), secret canary coins.",
        f"* Audit: {args.canaries} canaries per group, each included with probability 1/2; "
        "guesses on 10%, 25% and 50% of them (half on the highest scores, half on the "
        "lowest), Bonferroni over the three; confidence 95% (β = 0.05) for each group on its "
        "own; *joint ε ≥* holds for both groups of a row's audit together at 95% (β/2 each, "
        "Bonferroni); audits of different methods or canary kinds are separate statements. "
        "*certifiable ≤*: the largest ε these canaries could show with every guess right. "
        "Bound: Steinke, Nasr & Jagielski 2023, (ε, δ) with abstentions, rounded down "
        "(`dpfair/audit/bound.py`). DPSGD-F's claimed ε is each group's own steps accounted "
        "(`dpfair/accounting/per_group.py`).",
        "* Canaries: *gradient* = white-box Dirac canaries (a per-sample gradient of norm 1000 "
        "on one random parameter, clipped by the method like any example; score: the "
        "parameter's move against it); *mislabel* = black-box, group members with the other "
        "label (score: the final model's log-likelihood of that label).", "",
        "## Lower bounds per group", "",
        "| method | canaries | group | included | correct / guesses | ε ≥ | joint ε ≥ | μ ≥ "
        "| certifiable ≤ | claimed ε | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, kind, result, seconds in found:
        for g in result.groups:
            lines.append(f"| {label} | {kind} | {g.group} | {g.included} | {g.correct} / "
                         f"{g.guesses} | {g.epsilon_lower_bound:.3f} | "
                         f"{g.joint_lower_bound:.3f} | {g.mu_lower_bound:.3f} | "
                         f"{g.max_certifiable:.2f} | {claimed(g.epsilon_claimed)} | "
                         f"{seconds:.0f} |")
    lines += ["", "Figures: `figures/audit_<method>_<kind>.png` (score histograms of included "
              "and excluded canaries per group).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--canaries", type=int, default=1000, help="per group")
    parser.add_argument("--kinds", nargs="+", default=["gradient", "mislabel"],
                        choices=["gradient", "mislabel", "ood"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--no-controls", dest="controls", action="store_false",
                        help="skip the nonprivate and broken-dpsgd controls")
    parser.add_argument("--out", type=Path, default=RESULTS / "audit.md")
    args = parser.parse_args()
    found = run(args)
    args.out.write_text(report(args, found), encoding="utf-8")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
