"""Training runs recorded on a GPU host as results of a reproduction table.

A config with ``recorded_of: NAME`` and ``recorded: FILE`` is table NAME (its dataset, model,
methods, published table) rendered from ``benchmarks/results/raw/FILE``: JSON lines of
``dpfair.training.train`` runs made elsewhere (one per method and seed), described in
``raw/PROVENANCE.yaml`` (device, torch, commit, date, data and its sizes). Only lines at the
config's full length (``train.epochs``) count; lines of ``later:`` files at the same length
and on a (method, seed) of the main file are listed beside it (the same run on later code).
ε is accounted again with dpfair's accountant of today from the run's settings (the steps
must match the recorded ones) and named; the ε recorded with the runs (the accountant of
their day, RDP before 2026-11-26) is listed beside it. Nothing here trains.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dpfair import accounting
from dpfair.fairness.metrics import metric_records
from dpfair.training import TrainConfig, make_plan

RAW = Path(__file__).resolve().parent / "results" / "raw"
INHERITED_NOT = ("name", "title", "notes", "flag_notes", "shortened_on_cpu", "quick")


def merge(base: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The recorded config: table ``recorded_of``'s settings under this file's own keys."""
    return {**{k: v for k, v in base.items() if k not in INHERITED_NOT}, **cfg}


def _lines(path: Path, epochs: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["epochs"] == epochs]


def provenance(file: str, raw: Path = RAW) -> dict[str, Any]:
    """The ``PROVENANCE.yaml`` entry of one recorded file."""
    entries = yaml.safe_load((raw / "PROVENANCE.yaml").read_text())
    if file not in entries:
        raise KeyError(f"{file} has no entry in {raw / 'PROVENANCE.yaml'}")
    return entries[file]


def load(cfg: Mapping[str, Any], raw: Path = RAW) -> dict[str, Any]:
    """The result dict of ``benchmarks/reproduce.py`` (records, ε per method, settings, sizes)
    built from the recorded lines, with ``recorded``: the provenance and the later runs."""
    epochs = cfg["train"]["epochs"]
    lines = _lines(raw / cfg["recorded"], epochs)
    prov = provenance(cfg["recorded"], raw)
    names = [str(k) for k in range(len(lines[0]["group_accuracy"]))]
    labels = [m["label"] for m in cfg["methods"]]
    records: list[dict] = []
    epsilons: dict[str, list[float]] = {}
    recorded_eps: dict[str, list[float]] = {}
    accountants: dict[str, str] = {}
    for r in sorted(lines, key=lambda r: (r["seed"], labels.index(r["label"]))):
        metrics = {"group_accuracy": r["group_accuracy"], "group_loss": r["group_loss"],
                   "accuracy": r["acc"]}
        records += metric_records(metrics, r["label"], r["seed"], names)
        spend = _spend(cfg, r, prov["n_train"], len(names))
        epsilons.setdefault(r["label"], []).append(spend.epsilon)
        accountants[r["label"]] = spend.accountant
        recorded_eps.setdefault(r["label"], []).append(float(r["eps"]))
    seeds = sorted({r["seed"] for r in lines})
    later = []
    for file in cfg.get("later", []):
        same = {(r["label"], r["seed"]): r for r in lines}
        later += [{"file": file, **provenance(file, raw), "run": r,
                   "earlier": same[(r["label"], r["seed"])]}
                  for r in _lines(raw / file, epochs) if (r["label"], r["seed"]) in same]
    return {
        "kind": "table", "records": records, "epsilons": epsilons, "partial": False,
        "accountants": {k: v for k, v in accountants.items()
                        if v != accounting.ACCOUNTANT_NONE},
        "epsilons_recorded": recorded_eps,
        "settings": {m["label"]: {"method": m["method"], "lr": m["lr"]} for m in cfg["methods"]
                     if m["label"] in epsilons},
        "n_train": prov["n_train"], "n_test": prov["n_test"],
        "wall_s": sum(r["wall_s"] for r in lines),
        "config": {**cfg, "seeds": seeds, "device": "cuda"},
        "recorded": {"file": cfg["recorded"], **prov, "later": later},
    }


def _spend(cfg: Mapping[str, Any], line: Mapping[str, Any], n_train: int,
           n_groups: int) -> accounting.Spend:
    """ε of one recorded run by today's accountant, from the config's settings."""
    method = next(m for m in cfg["methods"] if m["label"] == line["label"])
    train = {k: v for k, v in cfg["train"].items() if k != "batch_size"}
    config = TrainConfig(method=method["method"], model=cfg["model"],
                         batch_size=cfg["train"]["batch_size"], lr=float(method["lr"]),
                         progress=False, **train)
    plan = make_plan(config, n_train, n_groups)
    if plan.steps != line["steps"]:
        raise ValueError(f"{line['label']} seed {line['seed']}: {plan.steps} planned steps, "
                         f"{line['steps']} recorded: the config does not describe the run")
    if plan.privacy_guarantee != "proven":
        return accounting.Spend(math.inf, plan.delta, accounting.ACCOUNTANT_NONE)
    return accounting.spend(plan.event, plan.delta)


def settings_lines(result: Mapping[str, Any], groups: list[str], labels: list[str]
                   ) -> list[str]:
    """Where the runs come from, and each later rerun beside its first run."""
    rec = result["recorded"]
    seeds = result["config"]["seeds"]
    lines = [f"- **RECORDED ON A GPU, full length**: `benchmarks/results/raw/{rec['file']}` "
             f"({rec['runs']}), {rec['device']}, torch {rec['torch']}, {rec['date']}, project "
             f"commit {rec['commit']}; wall time {result['wall_s'] / 60:.1f} min of GPU "
             "training in all (trained by `gpu_mnist.py` through `dpfair.training.train`; "
             "no MLflow run). The CPU-shortened table above is the same config at 3 epochs.",
             f"- **{len(seeds)} seed{'s' if len(seeds) > 1 else ''} "
             f"({', '.join(map(str, seeds))})**, not the paper's 5"
             + (": no SE" if len(seeds) == 1 else "")]
    then = {k: sum(v) / len(v) for k, v in result["epsilons_recorded"].items()
           if all(math.isfinite(e) for e in v)}
    lines.append("- ε recorded with the runs, by the accountant of their day "
                 f"({accounting.ACCOUNTANT_RDP}): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in then.items())
                 + "; the tables show today's accountant's ε for the same settings")
    for later in rec["later"]:
        new, old = later["run"], later["earlier"]
        figs = [f"acc_{lab} {100 * new['group_accuracy'][int(g)]:.1f} (then "
                f"{100 * old['group_accuracy'][int(g)]:.1f})"
                for g, lab in zip(groups, labels, strict=True) if g.isdigit()]
        lines.append(f"- rerun on commit {later['commit']} ({later['date']}, "
                     f"`raw/{later['file']}`): {new['label']} seed {new['seed']}, "
                     f"{', '.join(figs)}, recorded ε {new['eps']:.2f} (then {old['eps']:.2f})")
    return lines


def recorded_results(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every recorded config's result."""
    return {name: load(cfg) for name, cfg in configs.items() if cfg.get("recorded")}
