"""The steps of the experiment pipeline as plain functions.

``flows/experiment.py`` only orchestrates these: prepare the data (DVC stage,
:mod:`dpfair.pipeline.data_step`) -> plan what the run releases and check it against the
budget, before anything trains (:mod:`dpfair.pipeline.release_step`) -> tune each method that
has a search space -> train every method on every seed plus the non-private reference ->
fairness tables, significance tests and figures (:mod:`dpfair.pipeline.summary`) -> MLflow.
Every step logs into its own MLflow run through explicit run ids, so steps may run in threads
or processes.
``dpfair train`` and ``dpfair tune`` run the same steps alone (:mod:`dpfair.pipeline.standalone`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dp_accounting import dp_event

from dpfair import accounting
from dpfair.config.params import Params
from dpfair.config.sections import ReleaseMode
from dpfair.data import GroupedDataset
from dpfair.errors import PrivacyError, Terminated
from dpfair.fairness import metric_records
from dpfair.processes import stop_requested
from dpfair.release.labels import NO_NOISE, SECRET_NOISE
from dpfair.release.plan import MethodRelease, SearchRelease, search_release, write_ledger
from dpfair.tracking.run_log import (
    NOISE_TOKEN,
    EpochLogger,
    epsilon_by_group,
    event_with_note,
    headline,
    log_data_input,
    run_name,
)
from dpfair.tracking.runs import (
    TrackingConfig,
    described,
    log_json,
    log_metrics,
    log_params,
    log_table,
    log_text,
    run,
    set_tags,
    tag_number,
)
from dpfair.training import (
    REPLAYABLE_NOISE,
    TrainConfig,
    TrainResult,
    flat_metrics,
    train,
)
from dpfair.tuning import TuningConfig, TuningResult, tune

#: The artifact of a finished final training that a resumed pipeline reads back
#: (:mod:`dpfair.pipeline.resume`): its :class:`RunRecord`, test metrics already logged on the run.
RUN_RECORD = "pipeline/run_record.json"
#: The artifact of a finished search: the selected configuration that the final runs train
#: (what the search releases, as the params ``selected.*`` also show; no trial seed).
SELECTED_CONFIG = "selected_config.json"
@dataclass
class RunRecord:
    """What a final training leaves for the summary (plain data: crosses process borders).
    ``epsilon``: of this training run alone (``inf`` for a release without guarantee);
    ``model_uri``: its logged MLflow Model; ``headline``: its test metrics
    (:data:`dpfair.tracking.run_log.HEADLINE`)."""

    label: str
    seed: int
    run_id: str
    records: list[dict[str, Any]]
    history: dict[int, dict[str, float]]
    clip_trajectory: dict[str, list[float]]
    epsilon: float
    privacy_guarantee: str
    tuning_privacy: str
    model_uri: str
    headline: dict[str, float]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        """Read back :data:`RUN_RECORD` (JSON object keys are strings: epochs become ints)."""
        history = {int(epoch): groups for epoch, groups in data["history"].items()}
        return cls(**{**data, "history": history, "epsilon": float(data["epsilon"])})


@dataclass
class TuneRecord:
    """What a search leaves for the final runs: the selected configuration (and no K, no
    score: those stay in the private ledger unless ``tuning.release: all_trials``)."""

    label: str
    run_id: str
    best_config: dict[str, Any] | None
    tuning_privacy: str


# ------------------------------------------------------------------------- tuning


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
    """Private search for ``label`` in the study :func:`plan_release`
    prepared, logged as one MLflow run (:func:`log_search`) once it has run: a search that
    crashed leaves no run, so a resume never logs a second one."""
    exp = params.experiment
    base = exp.train_config(label, exp.seeds[0])
    cfg = params.tuning.config(label, study_name)
    mode = params.tuning.release
    # the search runs before its MLflow run opens: no published timestamps span the trials,
    # whose number is K (private unless tuning.release: all_trials)
    result: TuningResult = tune(base.method, base, dataset, cfg)
    search = _check_planned(result, cfg, release, mode)
    with run(tracking, experiment_id, run_name(dataset.name, f"tune {label}"),
             parent_run_id=parent_run_id,
             tags={"dpfair.stage": "tuning", "dpfair.method": label,
                   "dpfair.release": mode}) as tune_run_id:
        log_search(tracking, experiment_id, tune_run_id, label, cfg, result, search, release,
                   mode)
        best = result.best_config
        record = TuneRecord(
            label=label,
            run_id=tune_run_id,
            best_config=best.model_dump(mode="json") if best is not None else None,
            tuning_privacy=result.tuning_privacy,
        )
        log_json(tracking, tune_run_id, asdict(_released(record)), SELECTED_CONFIG)
    return record


def _released(record: TuneRecord) -> TuneRecord:
    """``record`` as the search may release it: the selected configuration without the seed
    of its trial (derived from the trial's number, which would tell about K); the final runs
    use their own seeds (:func:`final_config`)."""
    if record.best_config is None:
        return record
    return TuneRecord(record.label, record.run_id,
                      {k: v for k, v in record.best_config.items() if k != "seed"},
                      record.tuning_privacy)


def log_search(tracking: TrackingConfig, experiment_id: str, tune_run_id: str, label: str,
               cfg: TuningConfig, result: TuningResult, search: SearchRelease,
               release: MethodRelease, mode: ReleaseMode) -> Path:
    """A finished search on its run, and its ledger file.

    ``tuning.release: selected`` (default): the run holds only what the search's ε covers,
    the selected hyperparameters (params ``selected.*``), ε and the search's event; K, the
    trials and their scores go to the private ledger beside the Optuna storage
    (:func:`dpfair.release.plan.write_ledger`). ``all_trials``: K, the ledger and every trial (a
    nested run with its score) are logged too, and ε is their composition.
    Returns the ledger's path.
    """
    ledger = write_ledger(result, mode)
    log_params(tracking, tune_run_id, {"tuning": cfg.model_dump(mode="json"),
                                       "selected": result.best_params or {}})
    metrics: dict[str, float] = {}
    if release.has_epsilon:
        assert release.epsilon_search is not None  # a tuned method's release has a search
        metrics = {"epsilon_search": release.epsilon_search,
                   "epsilon_training": release.epsilon_run, "delta": release.delta}
    bounded = release.has_epsilon and release.epsilon_search is not None
    noise = {"dpfair.noise": REPLAYABLE_NOISE} if search.reproducible else {}
    accountants = {"dpfair.accountant_search": str(release.accountant_search),  # ACCOUNTANTS
                   "dpfair.accountant_training": release.accountant_run} if bounded else {}
    set_tags(tracking, tune_run_id, described({
        "tuning_privacy": result.tuning_privacy, "score_privacy": result.score_privacy,
        "dpfair.epsilon_search": tag_number(release.epsilon_search) if bounded
        else release.guarantee, **accountants, **{k: NOISE_TOKEN[v] for k, v in noise.items()}},
        {"dpfair.epsilon_search": search.label if release.has_epsilon
         else release.no_epsilon_label, **noise}))
    if search.event is not None and release.has_epsilon:
        log_text(tracking, tune_run_id, accounting.event_to_json(search.event),
                 "dp_event_search.json")
    if mode == "all_trials":
        metrics.update({"K": result.K, "runs": result.n_runs})
        log_json(tracking, tune_run_id, result.trials, "ledger.json")
        _log_trials(tracking, experiment_id, tune_run_id, label, result)
    log_metrics(tracking, tune_run_id, metrics)
    return ledger


def _log_trials(tracking: TrackingConfig, experiment_id: str, tune_run_id: str, label: str,
                result: TuningResult) -> None:
    """Every trial as a nested run with its hyperparameters and score (``all_trials`` only)."""
    for trial in result.trials:
        with run(tracking, experiment_id, f"{label} trial {trial['number']}",
                 parent_run_id=tune_run_id,
                 tags={"dpfair.stage": "tuning-trial", "dpfair.method": label,
                       "state": trial["state"], "ledger": trial["ledger"]}) as trial_id:
            log_params(tracking, trial_id, trial["params"])
            if trial["score"] is not None:
                log_metrics(tracking, trial_id, {f"score_{result.score}": trial["score"]})


# -------------------------------------------------------------------------------- training


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


def train_and_log(config: TrainConfig, label: str, *args: Any, **kwargs: Any) -> RunRecord:
    """Train one configuration in a (nested) MLflow run and log it: :func:`train_logged`, whose
    arguments it takes, without the training's result (the pipeline's task returns the
    record only; ``config`` and ``label`` name the task run)."""
    return train_logged(config, label, *args, **kwargs)[1]


def train_logged(
    config: TrainConfig,
    label: str,
    dataset: GroupedDataset,
    tracking: TrackingConfig,
    experiment_id: str,
    parent_run_id: str | None,
    data_tags: dict[str, str],
    release: MethodRelease,
    tuned: TuneRecord | None = None,
) -> tuple[TrainResult, RunRecord]:
    """Train one configuration in a run named dataset · method · seed and log section 7.

    Metrics (about 20 charts whatever the dataset): the test headline
    (:data:`dpfair.tracking.run_log.HEADLINE`) per epoch (``test/*``) and at the end
    (``final/test/*``), each group's final accuracy under
    ``final/test/group_accuracy/<group name>``, ``wall_time_s``, and for a method with a
    proven guarantee ``epsilon`` (this run alone) and ``epsilon_method_release`` (everything
    released for the method: ``release``); one without logs no ε, its ``dpfair.epsilon`` tag
    is its guarantee, and the run's description says why (:mod:`dpfair.release.plan`). No
    counts: the run's facts (σ, steps, q, δ) are params ``privacy.*``; DPSGD-F's per-group ε is
    the table ``privacy/epsilon_by_group``; the model: an MLflow Model
    (:mod:`dpfair.tracking.model_export`)."""
    from dpfair.tracking.model_export import log_model

    if stop_requested():  # a training queued before a SIGTERM never starts after it
        raise Terminated(143)
    tuning_privacy = tuned.tuning_privacy if tuned else "not_tuned"
    noise = (NO_NOISE if config.method.privacy_guarantee == "none"
             else REPLAYABLE_NOISE if config.reproducible else SECRET_NOISE)
    notes = {"dpfair.epsilon": release.epsilon_note, "dpfair.noise": noise}
    tags = {**data_tags, "dpfair.stage": "final", "dpfair.method": label,
            "dpfair.seed": str(config.seed), "tuning_privacy": tuning_privacy,
            "dpfair.diagnostics": "non-private" if config.nonprivate_stats else "off",
            "dpfair.epsilon": tag_number(release.epsilon_run) if release.has_epsilon
            else release.guarantee, "dpfair.noise": NOISE_TOKEN[noise]}
    with run(tracking, experiment_id, run_name(dataset.name, label, f"seed {config.seed}"),
             parent_run_id=parent_run_id, tags=described(tags, notes)) as run_id:
        version = data_tags.get("dpfair.data_version", "")
        log_data_input(tracking, run_id, dataset, version, dataset.name)
        log_params(tracking, run_id, config.model_dump(mode="json"))
        with EpochLogger(tracking, run_id) as epochs:  # a stopped training's epochs too
            result = train(config, dataset, callbacks=[epochs])
        found = headline(result.test_metrics)
        groups = {"group_accuracy": result.test_metrics["group_accuracy"]}
        metrics = {**{f"final/test/{k}": v for k, v in found.items()},
                   **flat_metrics(groups, "final/test/", group_names=dataset.group_names),
                   "wall_time_s": result.wall_time_s}
        facts = {"noise_multiplier": result.sigma, "count_noise_multiplier": result.count_sigma,
                 "steps": result.steps, "sample_rate": result.sample_rate}
        if release.has_epsilon:
            metrics.update({"epsilon": result.epsilon,
                            "epsilon_method_release": release.epsilon})
            facts.update({"delta": result.delta, "delta_release": release.delta})
        if result.test_release.noisy:
            metrics["epsilon_test_split"] = result.test_release.epsilon
            facts.update({"test_noise_multiplier": result.test_release.noise_multiplier,
                          "test_delta": result.test_release.delta})
        log_metrics(tracking, run_id, metrics)
        log_params(tracking, run_id, {"privacy": facts})
        notes["dpfair.test_metrics"] = result.test_release.label
        set_tags(tracking, run_id, described({
            "privacy_guarantee": result.privacy_guarantee, "dpfair.device": result.device,
            "dpfair.test_metrics": "noisy" if result.test_release.noisy else "exact"}, notes))
        if release.has_epsilon:
            log_text(tracking, run_id, event_with_note(result), "dp_event.json")
            if result.group_epsilons:
                log_table(tracking, run_id, epsilon_by_group(result, dataset),
                          "privacy/epsilon_by_group.json")
        trajectory = _trajectory(result)
        if trajectory:
            log_json(tracking, run_id, trajectory, "clip_trajectory.json")
        if config.nonprivate_stats:
            log_json(tracking, run_id, result.nonprivate_stats, "nonprivate_stats.json")
        model_uri = log_model(tracking, experiment_id, run_id, result, dataset,
                              {"method": label, "seed": str(config.seed),
                               "dpfair.noise": NOISE_TOKEN[noise]},
                              name=label, params={**config.model_dump(mode="json"),
                                                  "privacy": facts}, metrics=metrics)
        record = _run_record(result, label, config.seed, run_id, dataset, trajectory, release,
                             tuning_privacy, model_uri, found)
        log_json(tracking, run_id, asdict(record), RUN_RECORD)  # last: the run is complete
    return result, record


def _run_record(result: TrainResult, label: str, seed: int, run_id: str,
                dataset: GroupedDataset, trajectory: dict[str, list[float]],
                release: MethodRelease, tuning_privacy: str, model_uri: str,
                found: dict[str, float]) -> RunRecord:
    """The summary's view of a finished training (its released test metrics as records)."""
    history = {
        int(h["epoch"]): {dataset.group_names[k]: float(a)
                          for k, a in enumerate(h["test"]["group_accuracy"])}
        for h in result.history
    }
    return RunRecord(
        label=label, seed=seed, run_id=run_id,
        records=metric_records(result.test_metrics, label, seed, dataset.group_names,
                               dataset.class_names),
        history=history, clip_trajectory=trajectory,
        epsilon=result.epsilon if release.has_epsilon else math.inf,
        privacy_guarantee=result.privacy_guarantee, tuning_privacy=tuning_privacy,
        model_uri=model_uri, headline=found,
    )
