"""The CLI's standalone commands, ``dpfair train`` and ``dpfair tune``: one method in an MLflow
run of its own (no parent), logged like a pipeline's final run or search, through the privacy
gate first (:mod:`dpfair.ledger.gate`): ``budget.*`` exactly as a pipeline run, then the
lifetime budget of the people in the data, before anything trains."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from dpfair import accounting
from dpfair.config.params import Params
from dpfair.data import GroupedDataset
from dpfair.ledger import DataVersion, PrivacyGate
from dpfair.pipeline.check_step import (
    check_budget_delta,
    check_model_space,
    check_preprocessing,
    check_trainable,
)
from dpfair.pipeline.method_steps import RunRecord, log_search, train_logged
from dpfair.pipeline.preflight import check_tracking
from dpfair.processes import sigterm_raises
from dpfair.release.plan import (
    MethodRelease,
    SearchRelease,
    method_release,
    release_plan,
    search_release,
)
from dpfair.tracking.run_log import log_data_input, run_name
from dpfair.tracking.runs import existing_experiment, fail_stale_runs, run
from dpfair.tracking.runs import experiment_id as open_experiment
from dpfair.training import TrainResult, make_plan
from dpfair.tuning import TuningConfig, TuningResult, tune
from dpfair.tuning import prepare as prepare_search
from dpfair.tuning.study import study_identity

__all__ = ["open_gate", "train_standalone", "tune_standalone"]


def open_gate(params: Params, dataset: GroupedDataset, root: str | Path, command: str = ""
              ) -> tuple[PrivacyGate, DataVersion]:
    """The privacy gate of ``params`` and the data version of ``dataset`` (loaded from
    ``experiment.dataset``); the dataset's ``data_version`` becomes the published id."""
    name = params.experiment.dataset
    gate = PrivacyGate(params.budget, root)
    return gate, gate.identify(name, dataset, params.dataset(name), command=command)


@contextmanager
def _command(params: Params, dataset: GroupedDataset) -> Iterator[None]:
    """What a standalone command does before its checks and around its work, as ``dpfair run``
    does: the tracking store answers (before any privacy is reserved), runs a killed command
    left RUNNING are marked FAILED, and SIGTERM ends the command as an exception (its MLflow
    run ends FAILED, its ledger release is settled, no new trial starts)."""
    check_tracking(params.tracking)
    if (known := existing_experiment(params.tracking, dataset.name)) is not None:
        fail_stale_runs(params.tracking, known)
    with sigterm_raises():
        yield


def _standalone(params: Params, dataset: GroupedDataset, data: DataVersion
                ) -> tuple[str, dict[str, str]]:
    """A CLI command's experiment and data tags (as a pipeline run would have them)."""
    exp_id = open_experiment(params.tracking, dataset.name)
    return exp_id, {"dpfair.dataset": dataset.name, **data.tags()}


def train_standalone(params: Params, label: str, seed: int, dataset: GroupedDataset,
                     root: str | Path = ".", **overrides: Any) -> tuple[TrainResult, RunRecord]:
    """``dpfair train``: one method on one seed in a run of its own (no parent), logged like
    a pipeline's final run. Every check first (model, preprocessing, δ, batch size), then the
    privacy gate: its release (this one training run) is checked against ``budget.*`` exactly
    as a pipeline run's, and reserved against the lifetime budget of the people in the data."""
    config = params.experiment.train_config(label, seed, **overrides)
    check_preprocessing(params, dataset)
    check_budget_delta(params, dataset)
    check_trainable(config, dataset)
    check_model_space(params, dataset, 1)
    delta = params.budget.delta or config.delta
    plan = make_plan(config, len(dataset.train), dataset.n_groups, len(dataset.test))
    release = method_release(label, config.method.privacy_guarantee, [seed], [plan.event], None,
                             config.reproducible, delta, [plan.test])
    gate, data = open_gate(params, dataset, root, "dpfair train")
    with _command(params, dataset), gate.admit(
            release_plan([release], delta), data, command="dpfair train", method=label,
            seed=str(seed)) as spend:
        exp_id, data_tags = _standalone(params, dataset, data)
        spend.may_release()  # the command's MLflow run opens next
        result, record = train_logged(config, label, dataset, params.tracking, exp_id, None,
                                      data_tags, release)
        spend.context["mlflow_run_id"] = record.run_id
    return result, record


def tune_standalone(params: Params, label: str, cfg: TuningConfig, dataset: GroupedDataset,
                    root: str | Path = ".",
                    ) -> tuple[TuningResult, SearchRelease, MethodRelease, Path]:
    """``dpfair tune``: a search in a run of its own, logged like a pipeline's search (only
    what ``tuning.release`` releases, :func:`log_search`); returns the search ledger's path too.
    The search is prepared first (as :func:`plan_release` does: settings it refuses leave no
    record), then passes the privacy gate like any release: ``budget.*`` and the lifetime
    budget. A resumed study continues a search the ledger holds already (recorded under the
    study's identity in its storage): nothing new is reserved."""
    base = params.experiment.train_config(label, params.experiment.seeds[0])
    check_budget_delta(params, dataset)
    check_trainable(base, dataset)
    job = prepare_search(base.method, base, dataset, cfg)  # refuses bad settings first
    mode = params.tuning.release
    planned = search_release(job.cfg, accounting.event_from_json(job.run_event_json), job.k,
                             mode)
    release = method_release(label, base.method.privacy_guarantee, (), [planned.run_event],
                             planned, planned.reproducible, job.delta)
    plan = release_plan([release], job.delta)
    gate, data = open_gate(params, dataset, root, "dpfair tune")
    # what the search releases is part of its identity: a re-run that releases more (all
    # trials after the selected one) is another release, charged through the gate
    study = f"{study_identity(job)}::release={mode}"
    with _command(params, dataset):
        # the same search resumed, or joined by a `tune` started together: reserved once
        spending = gate.admit_once(plan, data, study, command="dpfair tune", method=label,
                                   study=study)
        return _tune_logged(params, label, cfg, dataset, data, base, release,
                            nullcontext(None) if spending is None else spending)


def _tune_logged(params: Params, label: str, cfg: TuningConfig, dataset: GroupedDataset,
                 data: DataVersion, base: Any, release: MethodRelease, spending: Any
                 ) -> tuple[TuningResult, SearchRelease, MethodRelease, Path]:
    """The search, then its MLflow run (opened after the last trial: no timestamp spans K)."""
    mode = params.tuning.release
    with spending as spend:
        if spend is not None:  # from its reservation on, other processes may join the search
            spend.may_release()
        exp_id, data_tags = _standalone(params, dataset, data)
        result = tune(base.method, base, dataset, cfg)  # no MLflow run spans the trials
        search = search_release(cfg, accounting.event_from_json(
            result.run_event_json or "null"), result.K, mode)
        with run(params.tracking, exp_id, run_name(dataset.name, f"tune {label}"),
                 tags={**data_tags, "dpfair.stage": "tuning", "dpfair.method": label,
                       "dpfair.release": mode}) as run_id:
            if spend is not None:
                spend.context["mlflow_run_id"] = run_id
            log_data_input(params.tracking, run_id, dataset, data.public_id, dataset.name)
            ledger = log_search(params.tracking, exp_id, run_id, label, cfg, result, search,
                                release, mode)
    return result, search, release, ledger
