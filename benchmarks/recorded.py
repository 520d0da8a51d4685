"""Training runs recorded on a GPU host as results of a reproduction table.

A config with ``recorded_of: NAME`` and ``recorded: FILE`` is table NAME (its dataset, model,
methods, published table) rendered from ``benchmarks/results/raw/FILE``: JSON lines of
``dpfair.training.train`` runs made elsewhere (one per method and seed), described in
``raw/PROVENANCE.yaml`` (device, torch, commit, date, data and its sizes). Only lines at the
config's full length (``train.epochs``) count; lines of ``later:`` files at the same length
and on a (method, seed) of the main file are listed beside it (the same run on later code).
Nothing here trains.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dpfair.fairness.metrics import metric_records

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
    for r in sorted(lines, key=lambda r: (r["seed"], labels.index(r["label"]))):
        metrics = {"group_accuracy": r["group_accuracy"], "group_loss": r["group_loss"],
                   "accuracy": r["acc"]}
        records += metric_records(metrics, r["label"], r["seed"], names)
        epsilons.setdefault(r["label"], []).append(float(r["eps"]))
    seeds = sorted({r["seed"] for r in lines})
    later = []
    for file in cfg.get("later", []):
        same = {(r["label"], r["seed"]): r for r in lines}
        later += [{"file": file, **provenance(file, raw), "run": r,
                   "earlier": same[(r["label"], r["seed"])]}
                  for r in _lines(raw / file, epochs) if (r["label"], r["seed"]) in same]
    return {
        "kind": "table", "records": records, "epsilons": epsilons, "partial": False,
        "settings": {m["label"]: {"method": m["method"], "lr": m["lr"]} for m in cfg["methods"]
                     if m["label"] in epsilons},
        "n_train": prov["n_train"], "n_test": prov["n_test"],
        "wall_s": sum(r["wall_s"] for r in lines),
        "config": {**cfg, "seeds": seeds, "device": "cuda"},
        "recorded": {"file": cfg["recorded"], **prov, "later": later},
    }


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
    for later in rec["later"]:
        new, old = later["run"], later["earlier"]
        figs = [f"acc_{lab} {100 * new['group_accuracy'][int(g)]:.1f} (then "
                f"{100 * old['group_accuracy'][int(g)]:.1f})"
                for g, lab in zip(groups, labels, strict=True) if g.isdigit()]
        lines.append(f"- rerun on commit {later['commit']} ({later['date']}, "
                     f"`raw/{later['file']}`): {new['label']} seed {new['seed']}, "
                     f"{', '.join(figs)}, ε {new['eps']:.2f} (then {old['eps']:.2f})")
    return lines


def recorded_results(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every recorded config's result."""
    return {name: load(cfg) for name, cfg in configs.items() if cfg.get("recorded")}
