"""The CLI's standalone commands, ``dpfair train`` and ``dpfair tune``: one method in an MLflow
run of its own (no parent), logged like a pipeline's final run or search, and recorded first in
the data source's privacy ledger (:mod:`dpfair.source_ledger`), refused over
``budget.lifetime_epsilon`` before anything trains."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dp_accounting import dp_event

from dpfair.checks import check_preprocessing
from dpfair.config import Params
from dpfair.data import GroupedDataset, source_version
from dpfair.experiment import RunRecord, log_search, train_logged
from dpfair.privacy import accounting
from dpfair.release import MethodRelease, SearchRelease, method_release, search_release
from dpfair.run_log import log_data_input, run_name
from dpfair.source_ledger import SourceLedger, Spending, reserve
from dpfair.tracking import experiment_id as open_experiment
from dpfair.tracking import run
from dpfair.training import TrainResult, make_plan
from dpfair.tuning import TuningConfig, TuningResult, tune
from dpfair.tuning import prepare as prepare_search

__all__ = ["ledger_spending", "train_standalone", "tune_standalone"]


def _arrays_md5(dataset: GroupedDataset) -> str:
    """The md5 of a loaded dataset's arrays (its version when the loader records none)."""
    digest = hashlib.md5()
    for split in dataset.splits().values():
        for tensor in (split.x, split.y, split.g):
            digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _standalone(params: Params, dataset: GroupedDataset) -> tuple[str, dict[str, str]]:
    """A CLI command's experiment and data tags (as a pipeline run would have them)."""
    version = dataset.meta.get("data_version") or _arrays_md5(dataset)
    exp_id = open_experiment(params.tracking, dataset.name)
    return exp_id, {"dpfair.dataset": dataset.name, "dpfair.data_version": version}


@contextmanager
def ledger_spending(params: Params, root: str | Path, event: dp_event.DpEvent, delta: float,
                     no_guarantee: str | None, *, skip: str | None = None,
                     **context: str) -> Iterator[Spending | None]:
    """A CLI command's release in the data source's privacy ledger (:mod:`dpfair.source_ledger`,
    ``budget.ledger`` under ``root``), reserved against ``budget.lifetime_epsilon`` before
    anything trains and settled when the block ends. ``skip``: a study already recorded (a
    resumed ``dpfair tune`` continues the same search: nothing new to reserve)."""
    book = SourceLedger(Path(root) / params.budget.ledger)
    name = params.experiment.dataset
    if skip is not None and any(r.counts and r.context.get("study") == skip
                                for r in book.releases(name)):
        yield None
        return
    reserved = reserve(book, name, source_version(name, params.dataset(name)), event, delta,
                       params.budget, without_guarantee=[no_guarantee] if no_guarantee else (),
                       **context)
    with book.spending(reserved) as spend:
        spend.may_release()  # the command's MLflow run opens next
        yield spend


def train_standalone(params: Params, label: str, seed: int, dataset: GroupedDataset,
                     root: str | Path = ".", **overrides: Any) -> tuple[TrainResult, RunRecord]:
    """``dpfair train``: one method on one seed in a run of its own (no parent), logged like
    a pipeline's final run; its release is this one training run, recorded in the data
    source's privacy ledger first (refused over ``budget.lifetime_epsilon``)."""
    config = params.experiment.train_config(label, seed, **overrides)
    check_preprocessing(params, dataset)
    delta = params.budget.delta or config.delta
    plan = make_plan(config, len(dataset.train), dataset.n_groups, len(dataset.test))
    release = method_release(label, config.method.privacy_guarantee, [seed], [plan.event], None,
                             config.reproducible, delta, [plan.test])
    event = release.ledger_event
    no_guarantee = None if release.has_epsilon else f"{label}: {release.no_epsilon_label}"
    with ledger_spending(params, root, event, delta, no_guarantee, command="dpfair train",
                          method=label, seed=str(seed)) as spend:
        exp_id, data_tags = _standalone(params, dataset)
        result, record = train_logged(config, label, dataset, params.tracking, exp_id, None,
                                      data_tags, release)
        if spend is not None:
            spend.context["mlflow_run_id"] = record.run_id
    return result, record


def tune_standalone(params: Params, label: str, cfg: TuningConfig, dataset: GroupedDataset,
                    root: str | Path = ".",
                    ) -> tuple[TuningResult, SearchRelease, MethodRelease, Path]:
    """``dpfair tune``: a search in a run of its own, logged like a pipeline's search (only
    what ``tuning.release`` releases, :func:`log_search`); returns the ledger's path too.
    The search is prepared first (as :func:`plan_release` does): settings it refuses, e.g. a
    budget it would exceed, leave no MLflow record. Its release (the search's event) is
    recorded in the data source's privacy ledger once per study: resuming a study continues
    the same search."""
    base = params.experiment.train_config(label, params.experiment.seeds[0])
    job = prepare_search(base.method, base, dataset, cfg)  # refuses bad settings first
    mode = params.tuning.release
    planned = search_release(job.cfg, accounting.event_from_json(job.run_event_json), job.k,
                             mode)
    no_guarantee = (None if planned.event is not None and base.method.privacy_guarantee
                    == "proven" else f"{label}: search without a DP guarantee")
    with ledger_spending(params, root, planned.event or dp_event.NoOpDpEvent(), job.delta,
                          no_guarantee, skip=cfg.study_name, command="dpfair tune",
                          method=label, study=cfg.study_name) as spend:
        exp_id, data_tags = _standalone(params, dataset)
        with run(params.tracking, exp_id, run_name(dataset.name, f"tune {label}"),
                 tags={**data_tags, "dpfair.stage": "tuning", "dpfair.method": label,
                       "dpfair.release": mode}) as run_id:
            if spend is not None:
                spend.context["mlflow_run_id"] = run_id
            log_data_input(params.tracking, run_id, dataset, data_tags["dpfair.data_version"],
                           dataset.name)
            result = tune(base.method, base, dataset, cfg)
            search = search_release(cfg, accounting.event_from_json(
                result.run_event_json or "null"), result.K, mode)
            release = method_release(label, base.method.privacy_guarantee, (),
                                     [search.run_event], search, search.reproducible,
                                     result.delta)
            ledger = log_search(params.tracking, exp_id, run_id, label, cfg, result, search,
                                release, mode)
    return result, search, release, ledger
