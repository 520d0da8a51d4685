"""The steps of the experiment pipeline as plain functions (DESIGN.md section 7).

``flows/experiment.py`` only orchestrates these: prepare the data (DVC stage) -> tune each
method that has a search space -> train every method on every seed plus the non-private
reference -> fairness tables, significance tests and figures -> MLflow. Every step logs into
its own MLflow run through explicit run ids, so steps may run in threads or processes.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml
from dp_accounting import dp_event

from dpfair import fairness, report
from dpfair.config import Params
from dpfair.data import GroupedDataset, data_version, load_prepared, prepare
from dpfair.fairness import GroupMetrics
from dpfair.privacy import accounting
from dpfair.tracking import (
    TrackingConfig,
    log_file,
    log_json,
    log_metrics,
    log_params,
    log_text,
    run,
    set_tags,
)
from dpfair.training import TrainConfig, TrainResult, flat_metrics, train
from dpfair.tuning import TuningResult, tune

REFERENCE = "nonprivate"


@dataclass(frozen=True)
class PreparedData:
    name: str
    path: str
    version: str


@dataclass
class RunRecord:
    """What a final training leaves for the summary (plain data: crosses process borders)."""

    label: str
    seed: int
    run_id: str
    records: list[dict[str, Any]]
    history: dict[int, dict[str, float]]
    clip_trajectory: dict[str, list[float]]
    epsilon: float
    epsilon_with_tuning: float
    privacy_guarantee: str
    tuning_privacy: str


@dataclass
class TuneRecord:
    label: str
    run_id: str
    best_config: dict[str, Any] | None
    epsilon_search: float
    tuning_privacy: str
    search_event_json: str | None
    k: int


@dataclass
class Summary:
    table: pd.DataFrame
    significance: pd.DataFrame
    figures: dict[str, str] = field(default_factory=dict)

    def markdown(self) -> str:
        parts = ["## Per-group results (mean ± SE over seeds)", "", self.table.to_markdown()]
        if not self.significance.empty:
            parts += ["", "## One-sided Wilcoxon p-values against the baseline", "",
                      self.significance.to_markdown()]
        return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------ data


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dvc_prepare_stages(root: str | Path) -> tuple[str, ...]:
    """The datasets that have a ``prepare@<name>`` stage: the ``foreach`` list of ``dvc.yaml``
    (the one place that list lives). No ``dvc.yaml`` under ``root``: none."""
    path = Path(root) / "dvc.yaml"
    if not path.is_file():
        return ()
    stages = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("stages", {})
    return tuple(str(name) for name in stages.get("prepare", {}).get("foreach", []))


def prepare_data(params: Params, root: str | Path, params_path: str | Path) -> PreparedData:
    """Run the dataset's DVC ``prepare`` stage and return where it wrote and its version.

    The version is the out hash DVC records in ``dvc.lock``. Without DVC (``pipeline.use_dvc``
    false, a dataset with no stage, or a params file other than the stage's) the dataset is
    prepared directly and the version is the md5 of its arrays, the same hash DVC would record.
    """
    root = Path(root).resolve()
    name = params.experiment.dataset
    out_dir = root / params.pipeline.data_dir
    uses_stage_params = Path(params_path).resolve() == root / "params.yaml"
    if params.pipeline.use_dvc and name in dvc_prepare_stages(root) and uses_stage_params:
        from dvc.repo import Repo

        os.environ.setdefault("DVC_NO_ANALYTICS", "1")
        # the stage's command is `python -m dpfair.cli ...`: run it with this interpreter
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        with Repo(str(root)) as repo:
            repo.reproduce(f"prepare@{name}")
        version = data_version(name, root / "dvc.lock")
        path = root / "data" / "prepared" / name
    else:
        prepare(name, params.dataset(name), out_dir)
        path = out_dir / name
        version = None
    version = version or _md5(path / "arrays.npz")
    return PreparedData(name=name, path=str(path), version=version)


def load_data(prepared: PreparedData) -> GroupedDataset:
    return load_prepared(prepared.path)


# ---------------------------------------------------------------------------------- tuning


def tune_method(
    params: Params,
    label: str,
    dataset: GroupedDataset,
    tracking: TrackingConfig,
    experiment_id: str,
    parent_run_id: str,
    study_name: str,
) -> TuneRecord:
    """Private search for ``label`` (DESIGN.md section 6), the trials logged as nested runs."""
    exp = params.experiment
    base = exp.train_config(label, exp.seeds[0])
    cfg = params.tuning.config(label, study_name)
    with run(tracking, experiment_id, f"tune:{label}", parent_run_id=parent_run_id,
             tags={"dpfair.stage": "tuning", "dpfair.method": label}) as tune_run_id:
        result: TuningResult = tune(base.method, base, dataset, cfg)
        log_params(tracking, tune_run_id, {"tuning": cfg.model_dump(mode="json")})
        log_metrics(tracking, tune_run_id, {
            "K": result.K, "runs": result.n_runs, "epsilon_search": result.epsilon_search,
            "epsilon_training": result.epsilon_training, "delta": result.delta,
        })
        set_tags(tracking, tune_run_id, {"tuning_privacy": result.tuning_privacy,
                                         "score_privacy": result.score_privacy})
        log_json(tracking, tune_run_id, result.trials, "ledger.json")
        if result.event_json:
            log_text(tracking, tune_run_id, result.event_json, "dp_event_search.json")
        for trial in result.trials:
            with run(tracking, experiment_id, f"trial:{label}:{trial['number']}",
                     parent_run_id=tune_run_id,
                     tags={"dpfair.stage": "tuning-trial", "dpfair.method": label,
                           "state": trial["state"], "ledger": trial["ledger"]}) as trial_id:
                log_params(tracking, trial_id, trial["params"])
                if trial["score"] is not None:
                    log_metrics(tracking, trial_id, {f"score_{result.score}": trial["score"]})
    best = result.best_config
    return TuneRecord(
        label=label,
        run_id=tune_run_id,
        best_config=best.model_dump(mode="json") if best is not None else None,
        epsilon_search=result.epsilon_search,
        tuning_privacy=result.tuning_privacy,
        search_event_json=result.event_json,
        k=result.K,
    )


# -------------------------------------------------------------------------------- training


class _EpochLogger:
    """Training callback: per-epoch TEST metrics into the run (test metrics are public)."""

    def __init__(self, tracking: TrackingConfig, run_id: str, dataset: GroupedDataset) -> None:
        self.tracking, self.run_id = tracking, run_id
        self.names = {"group_names": dataset.group_names, "class_names": dataset.class_names}

    def on_epoch_end(self, epoch: int, entry: dict[str, Any]) -> None:
        metrics = flat_metrics(entry["test"], "test/", **self.names)
        log_metrics(self.tracking, self.run_id, metrics, step=epoch)

    def on_train_end(self, result: TrainResult) -> None:
        return None


def final_config(params: Params, label: str, seed: int, tuned: TuneRecord | None) -> TrainConfig:
    """The configuration trained on ``seed``: the tuned one when a search ran, else fixed."""
    if tuned is not None and tuned.best_config is not None:
        return TrainConfig.model_validate({**tuned.best_config, "seed": seed})
    return params.experiment.train_config(label, seed)


def _trajectory(result: TrainResult) -> dict[str, list[float]]:
    """Clip bounds over steps (derived from noisy releases, hence private)."""
    series: dict[str, list[float]] = {}
    for state in result.clip_trajectory:
        for key, value in state.items():
            if isinstance(value, list):
                for k, v in enumerate(value):
                    series.setdefault(f"{key}[{k}]", []).append(float(v))
            elif isinstance(value, int | float):
                series.setdefault(key, []).append(float(value))
    return series


def _bounds(trajectory: dict[str, list[float]]) -> dict[str, list[float]]:
    """The clip bounds of a trajectory, without its step index and released counts."""
    return {k: v for k, v in trajectory.items() if k != "step" and "released" not in k}


def train_and_log(
    config: TrainConfig,
    label: str,
    dataset: GroupedDataset,
    tracking: TrackingConfig,
    experiment_id: str,
    parent_run_id: str,
    data_tags: dict[str, str],
    tuned: TuneRecord | None = None,
) -> RunRecord:
    """Train one configuration in a nested MLflow run and log everything of section 7."""
    tuning_privacy = tuned.tuning_privacy if tuned else "not tuned"
    tags = {**data_tags, "dpfair.stage": "final", "dpfair.method": label,
            "dpfair.seed": str(config.seed), "tuning_privacy": tuning_privacy,
            "dpfair.diagnostics": "non-private" if config.nonprivate_stats else "off"}
    with run(tracking, experiment_id, f"{label}:seed{config.seed}",
             parent_run_id=parent_run_id, tags=tags) as run_id:
        log_params(tracking, run_id, config.model_dump(mode="json"))
        result = train(config, dataset, callbacks=[_EpochLogger(tracking, run_id, dataset)])
        event = result.event
        private = not isinstance(event, dp_event.NonPrivateDpEvent)
        eps_tuning = result.epsilon
        if tuned is not None and tuned.search_event_json and private:
            search = accounting.event_from_json(tuned.search_event_json)
            eps_tuning = accounting.epsilon(dp_event.ComposedDpEvent([search, event]),
                                            result.delta)
        elif tuned is not None:
            eps_tuning = float("inf")
        names = {"group_names": dataset.group_names, "class_names": dataset.class_names}
        metrics = {**flat_metrics(result.test_metrics, "final/test/", **names),
                   "epsilon": result.epsilon, "epsilon_with_tuning": eps_tuning,
                   "delta": result.delta, "sigma": result.sigma, "steps": result.steps,
                   "sample_rate": result.sample_rate, "wall_time_s": result.wall_time_s}
        if result.group_epsilons:
            metrics.update({f"epsilon_group/{dataset.group_names[k]}": e
                            for k, e in enumerate(result.group_epsilons)})
        log_metrics(tracking, run_id, metrics)
        set_tags(tracking, run_id, {"privacy_guarantee": result.privacy_guarantee,
                                    "dpfair.device": result.device})
        if private:
            log_text(tracking, run_id, accounting.event_to_json(event), "dp_event.json")
        trajectory = _trajectory(result)
        if trajectory:
            log_json(tracking, run_id, trajectory, "clip_trajectory.json")
        if config.nonprivate_stats:
            log_json(tracking, run_id, result.nonprivate_stats, "nonprivate_stats.json")
        buffer = io.BytesIO()
        torch.save(result.model_state, buffer)
        with tempfile.TemporaryDirectory() as tmp:
            model_path = Path(tmp) / "model_state.pt"
            model_path.write_bytes(buffer.getvalue())
            log_file(tracking, run_id, model_path, "model")
    gm = GroupMetrics(**{k: np.asarray(v) if isinstance(v, list) else v
                         for k, v in result.test_metrics.items()})
    history = {
        int(h["epoch"]): {dataset.group_names[k]: float(a)
                          for k, a in enumerate(h["test"]["group_accuracy"])}
        for h in result.history
    }
    return RunRecord(
        label=label, seed=config.seed, run_id=run_id,
        records=gm.to_records(label, config.seed, dataset.group_names, dataset.class_names),
        history=history, clip_trajectory=trajectory, epsilon=result.epsilon,
        epsilon_with_tuning=eps_tuning, privacy_guarantee=result.privacy_guarantee,
        tuning_privacy=tuning_privacy,
    )


# --------------------------------------------------------------------------------- summary


def summarise(params: Params, dataset: GroupedDataset, runs: list[RunRecord],
              out_dir: str | Path) -> Summary:
    """Esipova-layout table, Wilcoxon p-values against the baseline, and the figures."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame = fairness.runs_frame([r for run_ in runs for r in run_.records])
    groups = tuple(params.experiment.pair or dataset.group_names[:2])
    methods = sorted({r.label for r in runs}, key=lambda m: (m != REFERENCE, m))
    has_reference = REFERENCE in methods
    table = fairness.comparison_table(
        frame, groups, reference=REFERENCE if has_reference else methods[0],
        max_gap_groups=list(dataset.group_names) if len(dataset.group_names) > 2 else None,
    )
    eps = pd.Series({m: np.mean([r.epsilon_with_tuning for r in runs if r.label == m])
                     for m in methods}, name="epsilon")
    table = table.join(eps.map(lambda e: "∞" if not np.isfinite(e) else f"{e:.2f}"))
    per_seed = fairness.seed_table(frame, groups,
                                   reference=REFERENCE if has_reference else methods[0])
    baseline = params.experiment.baseline
    significance = pd.DataFrame()
    if baseline in methods:
        significance = fairness.significance_table(per_seed, baseline=baseline, min_pairs=2)
    figures = {
        "group_accuracy": report.plot_group_accuracy(
            frame, out / "group_accuracy.png", groups=list(dataset.group_names)[:10],
            methods=methods),
        "training_curves": report.plot_training_curves(
            {m: [r.history for r in runs if r.label == m] for m in methods},
            out / "training_curves.png", groups=list(groups)),
    }
    if has_reference and len(methods) > 1:
        figures["privacy_cost"] = report.plot_privacy_cost(
            frame, out / "privacy_cost.png", reference=REFERENCE,
            groups=list(dataset.group_names)[:10],
            methods=[m for m in methods if m != REFERENCE])
    bounds = {r.label: _bounds(r.clip_trajectory) for r in runs
              if r.clip_trajectory and r.seed == params.experiment.seeds[0]}
    if bounds:
        figures["clip_bounds"] = report.plot_clip_bounds(bounds, out / "clip_bounds.png")
    (out / "results.md").write_text(Summary(table, significance).markdown())
    table.to_csv(out / "results.csv")
    return Summary(table=table, significance=significance,
                   figures={k: str(v) for k, v in figures.items()})


def log_summary(tracking: TrackingConfig, run_id: str, summary: Summary, out_dir: str | Path,
                failures: dict[str, str]) -> None:
    out = Path(out_dir)
    for name in ("results.md", "results.csv"):
        log_file(tracking, run_id, out / name, "results")
    for path in summary.figures.values():
        log_file(tracking, run_id, path, "figures")
    if failures:
        log_json(tracking, run_id, failures, "failures.json")
    set_tags(tracking, run_id, {"dpfair.failed_methods": ",".join(sorted(failures)) or "none"})
