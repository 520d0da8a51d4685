"""The steps of the experiment pipeline as plain functions (DESIGN.md section 7).

``flows/experiment.py`` only orchestrates these: prepare the data (DVC stage) -> plan what
the run releases and check it against the budget, before anything trains
(:func:`plan_release`, :mod:`dpfair.release`) -> tune each method that has a search space ->
train every method on every seed plus the non-private reference -> fairness tables,
significance tests and figures (:mod:`dpfair.summary`) -> MLflow. Every step logs into its
own MLflow run through explicit run ids, so steps may run in threads or processes.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from dp_accounting import dp_event

from dpfair.checks import check_against_data
from dpfair.config import Params
from dpfair.data import GroupedDataset, data_version, load_prepared, prepare
from dpfair.errors import ConfigError, PrivacyError
from dpfair.fairness import GroupMetrics
from dpfair.privacy import accounting
from dpfair.release import (
    SECRET_NOISE,
    MethodRelease,
    ReleasePlan,
    SearchRelease,
    check_budget,
    method_release,
    release_plan,
    search_release,
    write_ledger,
)
from dpfair.sections import ReleaseMode
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
from dpfair.training import (
    REPLAYABLE_NOISE,
    TrainConfig,
    TrainResult,
    flat_metrics,
    make_plan,
    train,
)
from dpfair.tuning import TuningConfig, TuningResult, tune
from dpfair.tuning import prepare as prepare_search

REFERENCE = "nonprivate"


@dataclass(frozen=True)
class PreparedData:
    name: str
    path: str
    version: str


@dataclass
class RunRecord:
    """What a final training leaves for the summary (plain data: crosses process borders).
    ``epsilon``: of this training run alone (``inf`` for a release without guarantee)."""

    label: str
    seed: int
    run_id: str
    records: list[dict[str, Any]]
    history: dict[int, dict[str, float]]
    clip_trajectory: dict[str, list[float]]
    epsilon: float
    privacy_guarantee: str
    tuning_privacy: str


@dataclass
class TuneRecord:
    """What a search leaves for the final runs: the selected configuration (and no K, no
    score: those stay in the private ledger unless ``tuning.release: all_trials``)."""

    label: str
    run_id: str
    best_config: dict[str, Any] | None
    tuning_privacy: str


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


# ------------------------------------------------------------------------- release, tuning


def plan_release(params: Params, dataset: GroupedDataset, studies: dict[str, str]) -> ReleasePlan:
    """Everything the run will release, with its ε, checked against ``params.budget``: a
    :class:`~dpfair.errors.PrivacyError` itemising the spend before anything trains.

    A tuned method's search is prepared here (:func:`dpfair.tuning.prepare`, in study
    ``studies[label]``): its events, and K, drawn once and kept in the study, which
    :func:`tune_method` reopens. A final run's event is its :func:`~dpfair.training.make_plan`
    event; a tuned method's is the search's per-run bound (:mod:`dpfair.release`). First,
    everything that needs the data is checked for every method (:mod:`dpfair.checks`), so no
    search opens a study while another method's settings are wrong.
    """
    check_against_data(params, dataset)
    untuned = [label for label in params.tuning.spaces if label not in studies]
    if untuned:
        raise ConfigError(f"tuning.spaces.{untuned[0]}: the pipeline tunes only the methods of "
                          "experiment.methods (dpfair tune --method tunes the others); remove "
                          "this space to run the pipeline")
    exp = params.experiment
    delta = params.budget.delta or exp.train.delta
    n_train, n_groups = len(dataset.train), dataset.n_groups
    releases = []
    for label in [*([REFERENCE] if exp.nonprivate_reference else []), *exp.methods]:
        base = exp.train_config(label, exp.seeds[0])
        search = None
        if label in params.tuning.spaces:
            job = prepare_search(base.method, base, dataset,
                                 params.tuning.config(label, studies[label]))
            search = search_release(job.cfg, accounting.event_from_json(job.run_event_json),
                                    job.k, params.tuning.release)
            events = [search.run_event] * len(exp.seeds)
        else:
            events = [make_plan(exp.train_config(label, seed), n_train, n_groups).event
                      for seed in exp.seeds]
        releases.append(method_release(label, base.method.privacy_guarantee, exp.seeds,
                                       events, search, base.reproducible, delta))
    plan = release_plan(releases, delta)
    check_budget(plan, params.budget)
    return plan


def _check_planned(result: TuningResult, cfg: TuningConfig, release: MethodRelease,
                   mode: ReleaseMode) -> SearchRelease:
    """The release of the search that ran, which must be the planned one (same events, same
    K): what is reported is what was accounted."""
    planned = release.search
    ran = search_release(cfg, accounting.event_from_json(result.run_event_json or "null"),
                         result.K, mode)
    if planned is None or _event_json(ran.event) != _event_json(planned.event):
        raise PrivacyError(f"the search of {release.label!r} ran with other privacy events than "
                           "planned; its results are not reported")
    return ran


def _event_json(event: dp_event.DpEvent | None) -> str | None:
    return None if event is None else accounting.event_to_json(event)


def tune_method(
    params: Params,
    label: str,
    dataset: GroupedDataset,
    tracking: TrackingConfig,
    experiment_id: str,
    parent_run_id: str,
    study_name: str,
    release: MethodRelease,
) -> TuneRecord:
    """Private search for ``label`` (DESIGN.md section 6) in the study :func:`plan_release`
    prepared, logged as one MLflow run.

    ``tuning.release: selected`` (default): the run holds only what the search's ε covers,
    the selected hyperparameters (params ``selected.*``), ε and the search's event; K, the
    trials and their scores go to the private ledger beside the Optuna storage
    (:func:`dpfair.release.write_ledger`). ``all_trials``: K, the ledger and every trial (a
    nested run with its score) are logged too, and ε is their composition.
    """
    exp = params.experiment
    base = exp.train_config(label, exp.seeds[0])
    cfg = params.tuning.config(label, study_name)
    mode = params.tuning.release
    with run(tracking, experiment_id, f"tune:{label}", parent_run_id=parent_run_id,
             tags={"dpfair.stage": "tuning", "dpfair.method": label,
                   "dpfair.release": mode}) as tune_run_id:
        result: TuningResult = tune(base.method, base, dataset, cfg)
        search = _check_planned(result, cfg, release, mode)
        write_ledger(result, mode)
        log_params(tracking, tune_run_id, {"tuning": cfg.model_dump(mode="json"),
                                           "selected": result.best_params or {}})
        metrics: dict[str, float] = {}
        if release.has_epsilon:
            assert release.epsilon_search is not None  # a tuned method's release has a search
            metrics = {"epsilon_search": release.epsilon_search,
                       "epsilon_training": release.epsilon_run, "delta": release.delta}
        set_tags(tracking, tune_run_id, {
            "tuning_privacy": result.tuning_privacy, "score_privacy": result.score_privacy,
            "dpfair.epsilon_search": search.label if release.has_epsilon
            else release.no_epsilon_label,
            **({"dpfair.noise": REPLAYABLE_NOISE} if search.reproducible else {}),
        })
        if search.event is not None and release.has_epsilon:
            log_text(tracking, tune_run_id, accounting.event_to_json(search.event),
                     "dp_event_search.json")
        if mode == "all_trials":
            metrics.update({"K": result.K, "runs": result.n_runs})
            log_json(tracking, tune_run_id, result.trials, "ledger.json")
            _log_trials(tracking, experiment_id, tune_run_id, label, result)
        log_metrics(tracking, tune_run_id, metrics)
    best = result.best_config
    return TuneRecord(
        label=label,
        run_id=tune_run_id,
        best_config=best.model_dump(mode="json") if best is not None else None,
        tuning_privacy=result.tuning_privacy,
    )


def _log_trials(tracking: TrackingConfig, experiment_id: str, tune_run_id: str, label: str,
                result: TuningResult) -> None:
    """Every trial as a nested run with its hyperparameters and score (``all_trials`` only)."""
    for trial in result.trials:
        with run(tracking, experiment_id, f"trial:{label}:{trial['number']}",
                 parent_run_id=tune_run_id,
                 tags={"dpfair.stage": "tuning-trial", "dpfair.method": label,
                       "state": trial["state"], "ledger": trial["ledger"]}) as trial_id:
            log_params(tracking, trial_id, trial["params"])
            if trial["score"] is not None:
                log_metrics(tracking, trial_id, {f"score_{result.score}": trial["score"]})


# -------------------------------------------------------------------------------- training


class _EpochLogger:
    """Training callback: per-epoch TEST metrics into the run (held-out data that ε does not
    cover, released without noise: :data:`dpfair.release.TEST_METRICS_NOTE`)."""

    def __init__(self, tracking: TrackingConfig, run_id: str, dataset: GroupedDataset) -> None:
        self.tracking, self.run_id = tracking, run_id
        self.names = {"group_names": dataset.group_names, "class_names": dataset.class_names}

    def on_epoch_end(self, epoch: int, entry: dict[str, Any]) -> None:
        metrics = flat_metrics(entry["test"], "test/", **self.names)
        log_metrics(self.tracking, self.run_id, metrics, step=epoch)

    def on_train_end(self, result: TrainResult) -> None:
        return None


def final_config(params: Params, label: str, seed: int, tuned: TuneRecord | None) -> TrainConfig:
    """The configuration trained on ``seed``: the tuned one when a search ran, else fixed
    (randomness as ``experiment.train.reproducible`` says, whatever the search's)."""
    if tuned is not None and tuned.best_config is not None:
        return TrainConfig.model_validate({**tuned.best_config, "seed": seed,
                                           "reproducible": params.experiment.train.reproducible})
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


def train_and_log(
    config: TrainConfig,
    label: str,
    dataset: GroupedDataset,
    tracking: TrackingConfig,
    experiment_id: str,
    parent_run_id: str,
    data_tags: dict[str, str],
    release: MethodRelease,
    tuned: TuneRecord | None = None,
) -> RunRecord:
    """Train one configuration in a nested MLflow run and log everything of section 7.

    A method with a proven guarantee logs ``epsilon`` (this run alone) and
    ``epsilon_method_release`` (everything released for the method: ``release``); one without
    logs no ε, and its ``dpfair.epsilon`` tag says why (:mod:`dpfair.release`)."""
    tuning_privacy = tuned.tuning_privacy if tuned else "not tuned"
    tags = {**data_tags, "dpfair.stage": "final", "dpfair.method": label,
            "dpfair.seed": str(config.seed), "tuning_privacy": tuning_privacy,
            "dpfair.diagnostics": "non-private" if config.nonprivate_stats else "off",
            "dpfair.epsilon": release.epsilon_note,
            "dpfair.noise": REPLAYABLE_NOISE if config.reproducible else SECRET_NOISE}
    with run(tracking, experiment_id, f"{label}:seed{config.seed}",
             parent_run_id=parent_run_id, tags=tags) as run_id:
        log_params(tracking, run_id, config.model_dump(mode="json"))
        result = train(config, dataset, callbacks=[_EpochLogger(tracking, run_id, dataset)])
        names = {"group_names": dataset.group_names, "class_names": dataset.class_names}
        metrics = {**flat_metrics(result.test_metrics, "final/test/", **names),
                   "sigma": result.sigma, "steps": result.steps,
                   "sample_rate": result.sample_rate, "wall_time_s": result.wall_time_s}
        if release.has_epsilon:
            metrics.update({"epsilon": result.epsilon, "delta": result.delta,
                            "epsilon_method_release": release.epsilon,
                            "delta_release": release.delta})
            metrics.update({f"epsilon_group/{dataset.group_names[k]}": e
                            for k, e in enumerate(result.group_epsilons or [])})
        log_metrics(tracking, run_id, metrics)
        set_tags(tracking, run_id, {"privacy_guarantee": result.privacy_guarantee,
                                    "dpfair.device": result.device})
        if release.has_epsilon:
            log_text(tracking, run_id, accounting.event_to_json(result.event), "dp_event.json")
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
        history=history, clip_trajectory=trajectory,
        epsilon=result.epsilon if release.has_epsilon else math.inf,
        privacy_guarantee=result.privacy_guarantee, tuning_privacy=tuning_privacy,
    )
