"""Reproduce the papers' published tables with dpfair and compare (issue #7).

Usage::

    .venv/bin/python benchmarks/reproduce.py [--only NAME ...] [--quick] [--seeds N]

Every table is one YAML file in ``benchmarks/configs/`` (dataset and options, model, methods
with the papers' hyperparameters, epochs, batch size, seeds, the key of the published table in
``reference/published.yaml``). Each run trains through the same pipeline as ``dpfair``'s
experiment flow (:func:`dpfair.experiment.train_and_log`, MLflow-logged into a store under
``outputs/reproduction/``), stores its raw per-run records as JSON next to it, and then
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
import pandas as pd
import recorded
import torch
import yaml
from machine import cpu_model
from report_claims import claims
from report_figures import fill, parse_section
from report_notes import CARRIED, CLAIMS, flag_reasons, markdown_flags, previous_sections

from dpfair import fairness, report
from dpfair.data import GroupedDataset, load_dataset
from dpfair.experiment import train_and_log
from dpfair.fairness import GroupMetrics
from dpfair.release import HEURISTIC, NONPRIVATE_REFERENCE, MethodRelease, method_release
from dpfair.tracking import TrackingConfig, experiment_id, log_json, log_metrics, run, set_tags
from dpfair.training import TrainConfig, TrainResult, make_plan, train
from dpfair.tuning import TuningConfig, tune

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "benchmarks" / "configs"
REPORT = ROOT / "benchmarks" / "results" / "reproduction.md"
WORK_DIR = ROOT / "outputs" / "reproduction"
PUBLISHED = Path(os.environ.get("DPFAIR_PUBLISHED",
                                ROOT.parent / "shared" / "reference" / "published.yaml"))
REFERENCE = "nonprivate"
N_SE = 2.0

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


def seed_list(seeds: int | Sequence[int]) -> list[int]:
    """``5`` -> ``[0, 1, 2, 3, 4]``; a list stays as it is."""
    return list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]


def published_table(key: str, path: Path = PUBLISHED) -> Any:
    """The entry ``a.b.c`` of ``published.yaml``."""
    node: Any = yaml.safe_load(path.read_text())
    for part in key.split("."):
        node = node[part]
    return node


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
    done: list[list] = list(prev.get("done", []))
    elapsed = float(prev.get("wall_s", 0.0))
    settings: dict[str, dict] = {}
    tags = {"dpfair.stage": "reproduction", "dpfair.table": cfg["name"]}

    def result(partial: bool) -> dict:
        return {"kind": "table", "records": records, "epsilons": epsilons, "done": done,
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
        set_tags(tracking, parent, {"grid": "reduced" if _grid_reduced(cfg) else "full"})
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


# ----------------------------------------------------------------------------- render


def _cell(mean: float, se: float, digits: int) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if se is None or (isinstance(se, float) and math.isnan(se)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def _digits(column: str, percent: bool) -> int:
    prefix = column.split("_")[0]
    if prefix in ("acc", "pi", "delta"):
        return 1 if percent else 4
    return 3 if column.startswith(("loss", "R")) else 2


def side_by_side(cmp: pd.DataFrame, percent: bool) -> pd.DataFrame:
    """``comparison_with_published`` rows as a method x column table of ``ours / published``
    cells, ``⚠`` marking a difference beyond two combined SEs."""
    methods = list(dict.fromkeys(cmp["method"]))
    columns = list(dict.fromkeys(cmp["column"]))
    out = pd.DataFrame("", index=pd.Index(methods, name="method"), columns=columns)
    for _, r in cmp.iterrows():
        d = _digits(r["column"], percent)
        pub_se = None if math.isnan(r["published_se"]) else r["published_se"]
        flag = " ⚠" if r["differs"] is True or (r["differs"] is not pd.NA and
                                                  bool(r["differs"])) else ""
        out.at[r["method"], r["column"]] = (
            f"{_cell(r['ours_mean'], r['ours_se'], d)} / {_cell(r['published_mean'], pub_se, d)}"
            f"{flag}")
    return out


def _xu_published(table: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Xu's Table 1 columns of one dataset, renamed to our labels (``total`` and two groups).

    ``published_columns`` names the three published columns (default ``{prefix}_total``,
    ``{prefix}_M``, ``{prefix}_F``)."""
    cols = table["columns"]
    names = cfg.get("published_columns") or [
        f"{cfg['published_prefix']}_{s}" for s in ("total", "M", "F")]
    idx = [cols.index(n) for n in names]
    labels = cfg["labels"]
    rows: dict[str, Any] = {"columns": [f"acc_{lab}" for lab in labels]
                            + [f"delta_{lab}" for lab in labels] + ["delta_gap"]}
    rows["nonprivate"] = [table["sgd"][i] for i in idx] + [None] * 4
    for pub, ours in (("dpsgd", "dpsgd"), ("naive", "naive_reweight"), ("dpsgd_f", "dpsgd_f")):
        d = [table[f"{pub}_minus_sgd"][i] for i in idx]
        acc = [table["sgd"][i] + dd for i, dd in zip(idx, d, strict=True)]
        rows[ours] = acc + d + [abs(d[1] - d[2])]
    return rows


def finished_seeds(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> list[int]:
    """Seeds on which every method finished (all of them, unless the run was cut short)."""
    if not result.get("partial"):
        return list(cfg["seeds"])
    done = {tuple(d) for d in result.get("done", [])}
    return [s for s in cfg["seeds"] if all((m["label"], s) in done for m in cfg["methods"])]


def _epsilon_cell(label: str, eps: float | None) -> str:
    """A method's ε cell: a number only for a proven guarantee; the non-private reference and
    heuristic methods (FairLens) carry their label (:mod:`dpfair.release`)."""
    if eps is not None and math.isfinite(eps) and eps > 0:
        return f"{eps:.2f}"
    return NONPRIVATE_REFERENCE if label == REFERENCE else HEURISTIC


def table_stats(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> pd.DataFrame:
    seeds = set(finished_seeds(cfg, result))
    frame = fairness.runs_frame([r for r in result["records"] if r["seed"] in seeds])
    return fairness.comparison_stats(
        frame, cfg["groups"], reference=REFERENCE, labels=cfg["labels"], layout=cfg["layout"],
        paired_reference=True, tau=cfg.get("tau", fairness.XU_TAU))


def _seeds(n: int) -> str:
    return "1 seed" if n == 1 else f"{n} seeds"


def render_table(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """Markdown of one ``table`` result."""
    percent = cfg["layout"] == "esipova"
    stats = table_stats(cfg, result)
    pub = published_table(cfg["published"])
    if cfg["layout"] == "xu":
        pub = _xu_published(pub, cfg)
    cmp = report.comparison_with_published(stats, pub, percent=percent, n_se=N_SE)
    ours = fairness.format_table(stats, percent=percent)
    eps = {m: float(np.mean(v)) for m, v in result["epsilons"].items()}
    ours["epsilon"] = [_epsilon_cell(m, eps.get(m)) for m in ours.index]
    lines = [
        f"Ours (mean ± SE over {_seeds(len(finished_seeds(cfg, result)))}; accuracies "
        f"{'in %' if percent else 'as fractions'}; ε measured by our accountant, "
        f"published ε = {cfg['published_epsilon']}):", "", ours.to_markdown(), "",
        f"Ours / published (⚠: |difference| > {N_SE:g} combined SEs; a published value "
        "without SE counts its SE as 0):", "", side_by_side(cmp, percent).to_markdown(), "",
    ]
    n_flag = int(cmp["differs"].fillna(False).sum())
    n_cmp = int(cmp["differs"].notna().sum())
    lines += [f"{n_flag} of {n_cmp} comparable cells differ beyond {N_SE:g} combined SEs."
              + (" No cell is comparable: one run on our side and no SE on the paper's."
                 if n_cmp == 0 else ""), ""]
    lines += flag_reasons(flagged_cells(cmp), cfg.get("flag_notes", []))
    return lines


def flagged_cells(cmp: pd.DataFrame) -> list[str]:
    """``method.column`` of every cell flagged ⚠ in a ``comparison_with_published`` frame."""
    hit = cmp[cmp["differs"].fillna(False).astype(bool)]
    return [f"{m}.{c}" for m, c in zip(hit["method"], hit["column"], strict=True)]


def three_way(cfg: Mapping[str, Any], result: Mapping[str, Any], vcfg: Mapping[str, Any],
              vresult: Mapping[str, Any]) -> list[str]:
    """Paper settings / released-code settings / published, cell by cell, and per method which
    of our two settings matches the published row more often (cells within 2 combined SEs)."""
    percent = cfg["layout"] == "esipova"
    pub = published_table(cfg["published"])
    both = [report.comparison_with_published(table_stats(c, r), pub, percent=percent, n_se=N_SE)
            .set_index(["method", "column"]) for c, r in ((cfg, result), (vcfg, vresult))]
    a = both[0]
    methods = list(dict.fromkeys(a.index.get_level_values(0)))
    columns = list(dict.fromkeys(a.index.get_level_values(1)))
    table = pd.DataFrame("", index=pd.Index(methods, name="method"), columns=columns + ["matches"])
    for m in methods:
        score = [0, 0, 0]
        for c in columns:
            if (m, c) not in a.index:
                continue
            d = _digits(c, percent)
            ra = a.loc[(m, c)]
            parts = []
            for k, frame in enumerate(both):
                if (m, c) not in frame.index or pd.isna(frame.loc[(m, c)]["ours_mean"]):
                    parts.append("-")
                    continue
                r = frame.loc[(m, c)]
                flag = bool(r["differs"]) if not pd.isna(r["differs"]) else None
                score[k] += flag is False
                score[2] += k == 0 and flag is not None
                parts.append(_cell(r["ours_mean"], r["ours_se"], d) + (" ⚠" if flag else ""))
            pub_se = None if math.isnan(ra["published_se"]) else ra["published_se"]
            table.at[m, c] = " / ".join([*parts, _cell(ra["published_mean"], pub_se, d)])
        if m not in vresult["settings"]:
            verdict = f"paper settings {score[0]}/{score[2]}; not in the released script"
        else:
            best = ("paper settings" if score[0] > score[1] else "released code"
                    if score[1] > score[0] else "both equally")
            verdict = (f"{best} (paper {score[0]}/{score[2]}, released {score[1]}/{score[2]} "
                       "cells within 2 SEs)")
        table.at[m, "matches"] = verdict
    return [f"Ours (paper settings, `{cfg['name']}`) / ours (released-code settings, "
            f"`{vcfg['name']}`) / published (⚠ on our cell: beyond {N_SE:g} combined SEs of "
            "the published one; ε: paper settings "
            f"{_eps_range(result)}, released code {_eps_range(vresult)}, published "
            f"{cfg['published_epsilon']}; the reasons of each setting's ⚠ are under its own "
            "table):", "", table.to_markdown(), ""]


def _eps_range(result: Mapping[str, Any]) -> str:
    eps = [float(np.mean(v)) for v in result["epsilons"].values() if np.isfinite(np.mean(v))]
    lo, hi = min(eps), max(eps)
    return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}"


def zhao_frame(result: Mapping[str, Any]) -> pd.DataFrame:
    frame = fairness.runs_frame(result["records"])
    return frame[frame["metric"] == fairness.ACCURACY]


def render_zhao(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    pub = published_table(cfg["published"])
    frame = zhao_frame(result)
    groups, labels = cfg["groups"], cfg["labels"]
    lines: list[str] = []
    rows = []
    for eps in result.get("partial_epsilons", cfg["epsilons"]):
        pub_eps = pub.get(str(eps), {})
        for m in cfg["methods"]:
            key = f"{m['label']}@{eps}"
            sel = frame[frame["method"] == key]
            if sel.empty:
                continue
            row: dict[str, Any] = {"ε": eps, "method": m["label"]}
            per_seed = sel.pivot_table(index="seed", columns="group", values="value")
            flags = []
            for g, lab, k in zip(groups, labels, range(len(groups)), strict=True):
                mean, se = fairness.mean_se(per_seed[g].to_numpy())
                entry = pub_eps.get(m["label"])
                pm, ps = (entry[k] if entry else (math.nan, math.nan))
                comb = math.sqrt(se**2 + ps**2) if not math.isnan(se) else ps
                differs = abs(mean - pm) > N_SE * comb if not math.isnan(pm) else False
                flags.append(differs)
                row[f"acc_{lab} ours"] = _cell(mean, se, 4)
                row[f"acc_{lab} published"] = _cell(pm, ps, 4) + (" ⚠" if differs else "")
            worst = per_seed[groups].min(axis=1)
            wm, ws = fairness.mean_se(worst.to_numpy())
            row["worst-group ours"] = _cell(wm, ws, 4)
            b = result["best"][key]
            row["best grid point (lr, clip)"] = f"{b['lr']:g}, {b['clip'] if b['clip'] else '-'}"
            row["ε measured"] = f"{result['epsilons'][key]:.3f}"
            rows.append(row)
    lines += [f"Best point of the {_grid_name(cfg)} ({len(cfg['grid']['lr'])} learning rates × "
              f"{len(cfg['grid']['clip'])} clip values), selected on validation macro accuracy "
              f"with seed {cfg['grid_seed']}, retrained on {len(cfg['seeds'])} seeds "
              "(mean ± SE; fractions; ⚠: |difference| > 2 combined SEs). "
              "`tuning_privacy: none` — the grid search itself is not accounted:", "",
              pd.DataFrame(rows).to_markdown(index=False), ""]
    if result.get("tnb"):
        tnb = pd.DataFrame(result["tnb"])
        agg = []
        for (eps, meth), part in tnb.groupby(["epsilon", "method"], sort=False):
            r = {"ε per run": eps, "method": meth, "repetitions": len(part),
                 "mean K": f"{part['K'].mean():.1f}",
                 "ε of the whole search (mean)": f"{part['epsilon_search'].mean():.3f}"}
            for g, lab in zip(groups, labels, strict=True):
                mean, se = fairness.mean_se(part[g].to_numpy())
                r[f"acc_{lab}"] = _cell(mean, se, 4)
            r["worst-group"] = _cell(*fairness.mean_se(part[groups].min(axis=1).to_numpy()), 4)
            agg.append(r)
        lines += ["Private tuning (`tnb`: K ~ truncated negative binomial, η = "
                  f"{cfg['tnb']['eta']}, μ = {cfg['tnb']['mu']}; points drawn uniformly from the "
                  f"{_grid_name(cfg).lower()}; best by noisy validation macro accuracy; test "
                  "accuracy of the "
                  "selected run, mean ± SE over repetitions of the whole search):", "",
                  pd.DataFrame(agg).to_markdown(index=False), ""]
    return lines


def _grid_reduced(cfg: Mapping[str, Any]) -> bool:
    """Whether the config's grid is smaller than the paper's (``paper_grid``: its sizes)."""
    paper = cfg.get("paper_grid", {})
    return any(len(cfg["grid"][k]) < n for k, n in paper.items())


def _grid_name(cfg: Mapping[str, Any]) -> str:
    return "REDUCED grid" if _grid_reduced(cfg) else "full grid of the paper"


def settings_lines(cfg: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    ds = cfg["dataset"]
    lines = [f"- data: `{ds['name']}` options `{json.dumps(ds.get('options', {}))}`; "
             f"n_train = {result['n_train']}, n_test = {result['n_test']}"
             + (f", n_val = {result['n_val']}" if "n_val" in result else "")
             + (f"; **subsampled to {cfg['subsample']} rows per split**"
                if cfg.get("subsample") else ""),
             f"- model: `{json.dumps(cfg['model'])}`; training: "
             f"`{json.dumps(cfg['train'])}`; seeds {cfg['seeds']}"]
    if cfg["kind"] == "table":
        for label, s in result["settings"].items():
            lines.append(f"- {label}: `{json.dumps(s['method'])}`, lr {s['lr']:.4g}")
    else:
        for m in cfg["methods"]:
            lines.append(f"- {m['label']}: `{json.dumps(m['method'])}`, grid over lr"
                         + (f" and `{m['clip_field']}`" if m.get("clip_field") else ""))
        lines.append(f"- target ε {cfg['epsilons']} at δ = {cfg['train']['delta']} (σ calibrated "
                     "per run with dpfair's accountant)")
    if result.get("recorded"):
        lines += recorded.settings_lines(result, cfg["groups"], cfg["labels"])
    else:
        lines.append(f"- wall time {result['wall_s'] / 60:.1f} min on {result['machine']}; "
                     f"finished {result['finished']}; MLflow parent run "
                     f"`{result['mlflow_run']}`")
    if cfg["kind"] == "table" and result.get("partial"):
        lines.append(f"- **PARTIAL: the run was cut short; the tables use the seeds on which "
                     f"every method finished: {finished_seeds(cfg, result)}**")
    if "partial_epsilons" in result:
        lines.append(f"- **PARTIAL: the run was cut short; only ε {result['partial_epsilons']} "
                     "finished (grid and seeds), private tuning did not run**")
    if cfg.get("shortened"):
        sh = cfg["shortened"]
        lines.append(f"- **SHORTENED ON CPU** (no GPU in this run): {cfg['train']['epochs']} "
                     f"epochs instead of the paper's {sh['from_epochs']}, {len(cfg['seeds'])} "
                     f"seeds instead of {sh['from_seeds']}. {sh.get('why', '').strip()} The same "
                     "config runs the paper's length where CUDA is available.")
    if cfg.get("quick"):
        lines.append("- **QUICK MODE: not a reproduction, a smoke test of the machinery**")
    return lines


def render(configs: Mapping[str, Mapping], results: Mapping[str, dict], out: Path,
           preamble: Iterable[str] = ()) -> str:
    """Write the report for every configured table; tables without results say so.

    Configs of ``kind: discussion`` (``title``, ``text``: prose written after reading the
    numbers, e.g. why we differ) are appended after the tables and the automatic checks."""
    discussions = {n: c for n, c in configs.items() if c.get("kind") == "discussion"}
    configs = {n: c for n, c in configs.items() if n not in discussions}
    lines = ["# Reproduction of the published results", "",
             "Generated by `benchmarks/reproduce.py` from `benchmarks/configs/*.yaml` "
             "(rerun: `make reproduce`, or `.venv/bin/python benchmarks/reproduce.py --only NAME`)."
             " Published numbers come from `reference/published.yaml`. Every final training is "
             "an MLflow run (default store `outputs/reproduction/mlflow.db`, or the "
             "`--work-dir`'s; one experiment per dataset, a parent run per table). Accuracy "
             "columns: `acc_*` per group, `pi_*` privacy cost (non-private minus private "
             "accuracy), `R_*` excess loss, `*_gap` their absolute difference between groups, "
             "`delta_*` private minus non-private accuracy (Xu's sign).", "", *preamble]
    figures = {}
    previous = previous_sections(out)
    carried_claims: list[str] = []
    for name, cfg_file in configs.items():
        start = len(lines)
        if name not in results and name in previous:
            body = previous[name][2:]
            reasons = flag_reasons(markdown_flags(body), cfg_file.get("flag_notes", []))
            at = next((i for i, ln in enumerate(body)
                       if ln.startswith("Known differences of setting")), len(body))
            lines += [*previous[name][:2], CARRIED, "", *body[:at], *reasons, *body[at:], ""]
            figures[name] = parse_section(lines[start:])
            if "main" not in figures[name].tables:  # no table to check: keep its old lines
                carried_claims += [ln for ln in previous.get(CLAIMS, [])
                                   if ln.startswith((f"- {cfg_file['title']}:",
                                                     f"- {cfg_file['title']}, ε ="))]
            continue
        lines += [f"## {cfg_file['title']} (`{name}`)", ""]
        if name not in results:
            lines += ["Not run (no results recorded for this table).", ""]
            continue
        result = results[name]
        # the ⚠ reasons come from the YAML as it is now, like the notes
        cfg = {**result["config"], "flag_notes": cfg_file.get("flag_notes", [])}
        lines += ["Settings:", "", *settings_lines(cfg, result), ""]
        wanted = len(seed_list(cfg_file["seeds"]))
        if (len(cfg["seeds"]) < wanted and not cfg.get("quick") and not cfg.get("shortened")
                and not cfg.get("recorded")):
            lines.insert(-1, f"- **seeds reduced to {len(cfg['seeds'])} (the config asks for "
                             f"{wanted}) to fit the time of the run that made this "
                             "report**")
        if cfg["kind"] == "table":
            lines += render_table(cfg, result)
        else:
            body = render_zhao(cfg, result)
            lines += body + flag_reasons(markdown_flags(body), cfg["flag_notes"])
        variant = next((v for v, c in configs.items()
                        if c.get("variant_of") == name and v in results), None)
        if variant is not None:
            lines += three_way(cfg, result, results[variant]["config"], results[variant])
        if cfg_file.get("notes"):  # from the YAML as it is now, not as stored with the run
            lines += [f"Known differences of setting: {cfg_file['notes']}", ""]
        figures[name] = parse_section(lines[start:])
    checked = ["### Qualitative claims checked", "",
               *claims(configs, figures, lambda c: _xu_published(published_table(c["published"]),
                                                                 c))]
    if carried_claims:
        checked += ["", "Carried over from the previous report (tables without a table to "
                    "check):", "", *carried_claims]
    lines += [f"## {CLAIMS}", "", *checked, ""]
    for disc in discussions.values():
        lines += [f"## {disc['title']}", "", disc["text"].rstrip(), ""]
    text = fill("\n".join(lines).rstrip() + "\n", figures)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


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
