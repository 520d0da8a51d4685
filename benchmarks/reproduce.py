"""Reproduce the papers' published tables with dpfair and compare (issue #7).

Usage::

    .venv/bin/python benchmarks/reproduce.py [--only NAME ...] [--quick] [--seeds N]

Every table is one YAML file in ``benchmarks/configs/`` (dataset and options, model, methods
with the papers' hyperparameters, epochs, batch size, seeds, the key of the published table in
``reference/published.yaml``). Each run trains through the same pipeline as ``dpfair``'s
experiment flow (:func:`dpfair.pipeline.method_steps.train_and_log`, MLflow-logged into a store
under ``outputs/reproduction/``), stores its raw per-run records as JSON next to it, and then
``benchmarks/results/reproduction.md`` is rendered from every table that has results: ours and
the published numbers side by side, differences beyond two combined standard errors flagged,
the settings, the wall time and the machine.

Two kinds of table:

* ``table`` -- fixed hyperparameters, every method on every seed, compared in Esipova et al.'s
  layout (accuracy, privacy cost, loss, excess risk per group) or Xu et al.'s (accuracy and
  change against SGD, with the equal-cost-of-privacy verdict).
* ``zhao`` -- Zhao et al.'s Table 6: for every target epsilon a (reduced) grid over learning
  rate and clip parameter scored on a validation split, the best point retrained on every
  seed; then private tuning (truncated negative binomial random search, Papernot & Steinke)
  with the epsilon of the whole search.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import recorded
import torch
import yaml
from machine import cpu_model
from report_render import REFERENCE, grid_reduced, render, seed_list

from dpfair import accounting
from dpfair.accounting.accountant import Spend
from dpfair.data import GroupedDataset, load_dataset
from dpfair.fairness import GroupMetrics
from dpfair.pipeline.method_steps import train_and_log
from dpfair.release.plan import MethodRelease, method_release
from dpfair.tracking.runs import TrackingConfig, experiment_id, log_json, log_metrics, run, set_tags
from dpfair.training import TrainConfig, TrainResult, make_plan, train
from dpfair.tuning import TuningConfig, tune

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "benchmarks" / "configs"
REPORT = ROOT / "benchmarks" / "results" / "reproduction.md"
WORK_DIR = ROOT / "outputs" / "reproduction"

# ----------------------------------------------------------------------------- configs


def load_configs(config_dir: Path = CONFIG_DIR) -> dict[str, dict[str, Any]]:
    """Every ``*.yaml`` of ``config_dir`` by its stem (the table's name), in file order."""
    configs = {}
    for path in sorted(config_dir.glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        cfg["name"] = path.stem
        if cfg.get("recorded_of"):
            cfg = recorded.merge(configs[cfg["recorded_of"]], cfg)
        configs[path.stem] = cfg
    return configs


def effective_config(cfg: Mapping[str, Any], quick: bool, seeds: int | None) -> dict[str, Any]:
    """The configuration actually run: ``quick`` overrides applied, seeds cut to ``seeds``."""
    out = copy.deepcopy(dict(cfg))
    if quick:
        q = out.get("quick", {})
        if "epochs" in q:
            out["train"]["epochs"] = q["epochs"]
        for key in ("seeds", "epsilons", "grid", "tnb", "subsample"):
            if key in q:
                out[key] = q[key]
    out["device"] = resolve_device(out.get("device", "cpu"))
    short = out.pop("shortened_on_cpu", None)
    if short and out["device"] == "cpu" and not quick:
        out["shortened"] = {"from_epochs": out["train"]["epochs"],
                            "from_seeds": len(seed_list(out["seeds"])), **short}
        out["train"]["epochs"] = short["epochs"]
        out["seeds"] = short["seeds"]
    listed = seed_list(out["seeds"])
    if seeds is not None:
        listed = listed[:seeds] if seeds <= len(listed) else list(
            range(listed[0], listed[0] + seeds))
    out["seeds"] = listed
    out["quick"] = quick
    return out


def resolve_device(device: str) -> str:
    """``auto`` is ``cuda`` where a GPU is visible, else ``cpu``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


# -------------------------------------------------------------------------------- data


_DATA_CACHE: dict[str, GroupedDataset] = {}


def dataset_for(cfg: Mapping[str, Any], seed: int | None = None) -> GroupedDataset:
    """The configured dataset, its training split subsampled when ``subsample`` is set.

    With ``data_seed: run`` in the config the dataset's ``seed`` (split, group subsample) is the
    run's ``seed``, as in fair-dp's scripts, where one seed drives data and training."""
    spec = copy.deepcopy(dict(cfg["dataset"]))
    if cfg.get("data_seed") == "run" and seed is not None:
        spec["options"] = {**spec.get("options", {}), "seed": seed}
    key = json.dumps([spec, cfg.get("subsample")], sort_keys=True)
    if key not in _DATA_CACHE:
        ds = load_dataset(spec["name"], dict(spec.get("options", {})))
        n = cfg.get("subsample")
        if n:
            gen = torch.Generator().manual_seed(0)
            for split in ("train", "test", "val"):
                part = getattr(ds, split)
                if len(part) > n:
                    ds = replace(ds, **{split: part.subset(torch.randperm(len(part),
                                                                          generator=gen)[:n])})
        _DATA_CACHE[key] = ds
    return _DATA_CACHE[key]


def _one_run(config: TrainConfig, label: str, ds: GroupedDataset) -> MethodRelease:
    """What one logged training releases on its own: the reproduction tables report each run's
    ε (the grid searches here are on validation data and say ``tuning_privacy: none``)."""
    plan = make_plan(config, len(ds.train), ds.n_groups)
    return method_release(label, plan.privacy_guarantee, [config.seed], [plan.event], None,
                          config.reproducible, config.delta)


def _spend(config: TrainConfig, ds: GroupedDataset) -> Spend | None:
    """ε of one run and its accountant (None: no guarantee), as ``train_and_log`` plans it."""
    plan = make_plan(config, len(ds.train), ds.n_groups)
    return accounting.spend(plan.event, plan.delta) if plan.privacy_guarantee == "proven" else None


def resolve_lr(lr: float | str, cfg: Mapping[str, Any], n_train: int) -> float:
    """A number, or ``inv_sqrt_T``: Xu et al.'s ``1/sqrt(T)``, ``T = epochs * n / b``."""
    if lr == "inv_sqrt_T":
        steps = cfg["train"]["epochs"] * n_train / cfg["train"]["batch_size"]
        return 1.0 / math.sqrt(steps)
    return float(lr)


def batch_size(cfg: Mapping[str, Any], n_train: int) -> int:
    """The expected batch size; ``full`` is the whole training split (q = 1); a batch larger
    than the (subsampled) training split is cut to it."""
    b = cfg["train"]["batch_size"]
    return n_train if b == "full" else min(int(b), n_train)


def machine() -> str:
    """A one-line description of where this ran."""
    return (f"{platform.node()}: {cpu_model()}, {os.cpu_count()} logical CPUs visible, "
            f"torch {torch.__version__} with {torch.get_num_threads()} thread(s), "
            f"{'CUDA available' if torch.cuda.is_available() else 'no GPU'}")


# ---------------------------------------------------------------------------- tracking


def tracking_config(work_dir: Path) -> TrackingConfig:
    """MLflow store of the reproduction runs (outside git, under ``outputs/``)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    return TrackingConfig(uri=f"sqlite:///{work_dir / 'mlflow.db'}",
                          artifact_root=str(work_dir / "mlartifacts"),
                          experiment_prefix="dpfair-reproduction")


def _records(result: TrainResult, label: str, seed: int, ds: GroupedDataset) -> list[dict]:
    gm = GroupMetrics(**{k: np.asarray(v) if isinstance(v, list) else v
                         for k, v in result.test_metrics.items()})
    return gm.to_records(label, seed, ds.group_names, ds.class_names)


# ------------------------------------------------------------------------- table runner


def run_table(cfg: Mapping[str, Any], tracking: TrackingConfig, log: Any = print,
              save: Any = None, previous: Mapping[str, Any] | None = None) -> dict:
    """Every method on every seed with the paper's fixed hyperparameters, seed by seed (so a
    run cut short leaves whole seeds).

    ``save(partial)`` is called after every training with the results so far; ``previous``, a
    partial result of the same configuration, is resumed: its finished runs are kept, not
    repeated."""
    ds = dataset_for(cfg, cfg["seeds"][0])
    n_train = len(ds.train)
    exp_id = experiment_id(tracking, cfg["dataset"]["name"])
    prev = dict(previous or {})
    sizes: dict[str, list[int]] = {k: list(v) for k, v in prev.get("sizes", {}).items()}
    records: list[dict] = list(prev.get("records", []))
    epsilons: dict[str, list[float]] = {k: list(v) for k, v in prev.get("epsilons", {}).items()}
    accountants: dict[str, str] = dict(prev.get("accountants", {}))
    done: list[list] = list(prev.get("done", []))
    elapsed = float(prev.get("wall_s", 0.0))
    settings: dict[str, dict] = {}
    tags = {"dpfair.stage": "reproduction", "dpfair.table": cfg["name"]}

    def result(partial: bool) -> dict:
        return {"kind": "table", "records": records, "epsilons": epsilons, "done": done,
                "accountants": accountants,
                "settings": settings, "n_train": n_train, "n_test": len(ds.test), "sizes": sizes,
                "wall_s": elapsed, "mlflow_run": parent, "partial": partial}

    if done:
        log(f"[{cfg['name']}] resuming: {len(done)} runs already done")
    with run(tracking, exp_id, f"reproduce:{cfg['name']}", tags=tags) as parent:
        for seed in cfg["seeds"]:
            ds = dataset_for(cfg, seed)
            n_train = len(ds.train)
            sizes[str(seed)] = [n_train, len(ds.test)]
            for m in cfg["methods"]:
                label = m["label"]
                lr = resolve_lr(m["lr"], cfg, n_train)
                settings[label] = {"method": m["method"], "lr": lr}
                if [label, seed] in done:
                    continue
                train_kw = {k: v for k, v in cfg["train"].items() if k != "batch_size"}
                if label == REFERENCE:
                    train_kw["sigma"] = 0.0
                config = TrainConfig(method=m["method"], model=cfg["model"],
                                     batch_size=batch_size(cfg, n_train), lr=lr, seed=seed,
                                     progress=False, device=cfg["device"], **train_kw)
                t0 = time.time()
                rec = train_and_log(config, label, ds, tracking, exp_id, parent, tags,
                                    _one_run(config, label, ds))
                records += rec.records
                epsilons.setdefault(label, []).append(rec.epsilon)
                spend = _spend(config, ds)
                if spend is not None:
                    accountants[label] = spend.accountant
                done.append([label, seed])
                elapsed += time.time() - t0
                log(f"[{cfg['name']}] {label} seed {seed}: eps {rec.epsilon:.3f} "
                    f"({time.time() - t0:.1f} s)")
                if save is not None:
                    save(result(partial=True))
        log_metrics(tracking, parent, {"wall_time_s": elapsed})
    return result(partial=False)


# -------------------------------------------------------------------------- zhao runner


def _zhao_config(cfg: Mapping[str, Any], m: Mapping[str, Any], eps: float, lr: float,
                 clip: float | None, seed: int, n_train: int) -> TrainConfig:
    method = dict(m["method"])
    if m.get("clip_field") and clip is not None:
        method[m["clip_field"]] = clip
    train_kw = {k: v for k, v in cfg["train"].items() if k != "batch_size"}
    return TrainConfig(method=method, model=cfg["model"], batch_size=batch_size(cfg, n_train),
                       lr=lr, target_epsilon=eps, seed=seed, progress=False,
                       device=cfg.get("device", "cpu"), **train_kw)


def _group_acc(result: TrainResult, ds: GroupedDataset) -> dict[str, float]:
    return {g: float(a) for g, a in zip(ds.group_names, result.test_metrics["group_accuracy"],
                                        strict=True)}


def run_zhao(cfg: Mapping[str, Any], tracking: TrackingConfig, log: Any = print,
             save: Any = None) -> dict:
    """Zhao's Table 6: best point of a (reduced) grid on every seed, then private tuning.

    ``save(partial)`` is called after every epsilon with the results so far (a checkpoint
    the report can render if the run is cut short)."""
    ds = dataset_for(cfg)
    n_train = len(ds.train)
    exp_id = experiment_id(tracking, cfg["dataset"]["name"])
    grid_rows: list[dict] = []
    records: list[dict] = []
    best: dict[str, dict] = {}
    eps_run: dict[str, float] = {}
    tnb_rows: list[dict] = []
    start = time.time()
    tags = {"dpfair.stage": "reproduction", "dpfair.table": cfg["name"]}
    with run(tracking, exp_id, f"reproduce:{cfg['name']}", tags=tags) as parent:
        for eps in cfg["epsilons"]:
            for m in cfg["methods"]:
                clips = cfg["grid"]["clip"] if m.get("clip_field") else [None]
                scored = []
                for lr in cfg["grid"]["lr"]:
                    for clip in clips:
                        config = _zhao_config(cfg, m, eps, lr, clip, cfg["grid_seed"], n_train)
                        res = train(config, ds)
                        row = {"epsilon": eps, "method": m["label"], "lr": lr, "clip": clip,
                               "val_macro_accuracy": float(res.val_metrics["macro_accuracy"]),
                               "sigma": res.sigma, **_group_acc(res, ds)}
                        grid_rows.append(row)
                        scored.append(row)
                top = max(scored, key=lambda r: (np.nan_to_num(r["val_macro_accuracy"], nan=-1)))
                key = f"{m['label']}@{eps}"
                best[key] = {"lr": top["lr"], "clip": top["clip"],
                             "val_macro_accuracy": top["val_macro_accuracy"]}
                log(f"[{cfg['name']}] eps {eps} {m['label']}: best lr {top['lr']} "
                    f"clip {top['clip']} (val macro {top['val_macro_accuracy']:.4f}, "
                    f"{len(scored)} points)")
                for seed in cfg["seeds"]:
                    config = _zhao_config(cfg, m, eps, top["lr"], top["clip"], seed, n_train)
                    rec = train_and_log(config, key, ds, tracking, exp_id, parent,
                                        {**tags, "dpfair.epsilon_target": str(eps),
                                         "tuning_privacy": "none (grid on validation)"},
                                        _one_run(config, key, ds))
                    records += rec.records
                    eps_run[key] = rec.epsilon
            if save is not None:
                done = [e for e in cfg["epsilons"] if any(k.endswith(f"@{e}") for k in best)]
                save({"kind": "zhao", "records": records, "grid": grid_rows, "best": best,
                      "epsilons": eps_run, "tnb": [], "n_train": n_train, "n_val": len(ds.val),
                      "n_test": len(ds.test), "wall_s": time.time() - start,
                      "mlflow_run": parent, "partial_epsilons": done})
        log_json(tracking, parent, grid_rows, "grid.json")
        tnb = cfg.get("tnb")
        if tnb:
            tnb_rows = _run_tnb(cfg, tnb, ds, n_train, tracking, exp_id, parent, log)
        wall = time.time() - start
        log_metrics(tracking, parent, {"wall_time_s": wall})
        set_tags(tracking, parent, {"grid": "reduced" if grid_reduced(cfg) else "full"})
    return {"kind": "zhao", "records": records, "grid": grid_rows, "best": best,
            "epsilons": eps_run, "tnb": tnb_rows, "n_train": n_train, "n_val": len(ds.val),
            "n_test": len(ds.test), "wall_s": wall, "mlflow_run": parent}


def _run_tnb(cfg: Mapping[str, Any], tnb: Mapping[str, Any], ds: GroupedDataset, n_train: int,
             tracking: TrackingConfig, exp_id: str, parent: str, log: Any) -> list[dict]:
    rows = []
    storage = f"sqlite:///{WORK_DIR / 'optuna.db'}"
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    for eps in tnb["epsilons"]:
        for m in cfg["methods"]:
            base = _zhao_config(cfg, m, eps, cfg["grid"]["lr"][0], None, 0, n_train)
            space: dict[str, list] = {"lr": list(cfg["grid"]["lr"])}
            if m.get("clip_field"):
                space[m["clip_field"]] = list(cfg["grid"]["clip"])
            for rep in range(int(tnb["repetitions"])):
                tcfg = TuningConfig(mode="tnb", eta=float(tnb["eta"]), mu=float(tnb["mu"]),
                                    space=space, score="macro_accuracy", seed=rep,
                                    storage=storage,
                                    study_name=f"{cfg['name']}-{m['label']}-{eps}-{rep}-{stamp}")
                t0 = time.time()
                res = tune(base.method, base, ds, tcfg)
                acc = (_group_acc(res.best_result, ds) if res.best_result is not None
                       else dict.fromkeys(ds.group_names, math.nan))
                row = {"epsilon": eps, "method": m["label"], "rep": rep, "K": res.K,
                       "runs": res.n_runs, "epsilon_training": res.epsilon_training,
                       "epsilon_search": res.epsilon_search, "best_params": res.best_params,
                       **acc}
                rows.append(row)
                with run(tracking, exp_id, f"tnb:{m['label']}@{eps}:{rep}", parent_run_id=parent,
                         tags={"dpfair.stage": "tuning", "tuning_privacy": "tnb"}) as rid:
                    log_metrics(tracking, rid, {k: v for k, v in row.items()
                                                if isinstance(v, int | float)})
                log(f"[{cfg['name']}] tnb eps {eps} {m['label']} rep {rep}: K {res.K}, "
                    f"eps_search {res.epsilon_search:.3f}, {acc} ({time.time() - t0:.1f} s)")
    return rows


# -------------------------------------------------------------------------------- main


def run_one(cfg: Mapping[str, Any], tracking: TrackingConfig, results_dir: Path,
            log: Any = print) -> dict:
    """Run one table and store its result (with the effective config) as JSON."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{cfg['name']}.json"

    def write(result: dict) -> dict:
        result.update({"config": dict(cfg), "machine": machine(),
                       "finished": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")})
        path.write_text(json.dumps(result, indent=1, default=_json_default))
        return result

    if cfg["kind"] == "table":
        previous = json.loads(path.read_text()) if path.exists() else None
        if previous is not None and not (
            previous.get("partial") and _same_run(previous.get("config", {}), cfg)
        ):
            previous = None
        return write(run_table(cfg, tracking, log, save=write, previous=previous))
    return write(run_zhao(cfg, tracking, log, save=write))


def _same_run(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two effective configs describe the same runs (seeds may differ)."""
    def key(c: Mapping[str, Any]) -> str:
        return json.dumps({k: v for k, v in c.items() if k != "seeds"}, sort_keys=True)
    return key(a) == key(b)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def load_results(results_dir: Path, names: Iterable[str]) -> dict[str, dict]:
    out = {}
    for name in names:
        path = results_dir / f"{name}.json"
        if path.exists():
            out[name] = json.loads(path.read_text())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="table names (config stems)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test settings")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds per method")
    parser.add_argument("--config-dir", type=Path, default=CONFIG_DIR)
    parser.add_argument("--out", type=Path, default=None, help="report path")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="MLflow store and raw results (default outputs/reproduction)")
    parser.add_argument("--render-only", action="store_true",
                        help="re-render the report from stored results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's RDP order warnings
    global WORK_DIR
    work = args.work_dir or (WORK_DIR / "quick" if args.quick else WORK_DIR)
    WORK_DIR = work
    out = args.out or (work / "reproduction.md" if args.quick else REPORT)
    results_dir = work / "results"
    configs = load_configs(args.config_dir)
    names = args.only or [n for n, c in configs.items()
                          if c.get("kind") != "discussion" and not c.get("recorded")]
    unknown = [n for n in names if n not in configs]
    if unknown:
        parser.error(f"unknown tables {unknown}; known: {list(configs)}")
    tracking = tracking_config(work)
    if not args.render_only:
        for name in names:
            cfg = effective_config(configs[name], args.quick, args.seeds)
            print(f"== {name} ({cfg['title']})", flush=True)
            run_one(cfg, tracking, results_dir, log=lambda s: print(s, flush=True))
    render(configs, {**load_results(results_dir, configs), **recorded.recorded_results(configs)},
           out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
