"""The search driver: :func:`prepare` (validate and account, before any training), the
workers, and :func:`finish` (wait for the runs and select the best); :func:`tune` does all three.

The search's epsilon depends only on the distribution of K (μ, η), the run event and the score
event (:mod:`dpfair.tuning.search_events`), so it is computed and checked against ``budget_epsilon``
before the first run. Resuming (calling ``tune`` again with the same study) continues until K
runs are claimed, then waits until no run is RUNNING, and selects the best completed run.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from dp_accounting import dp_event
from pydantic import BaseModel, ValidationError

from dpfair import accounting
from dpfair.errors import BudgetExceededError, ConfigError, TuningError, format_validation_error
from dpfair.tuning.config import Scalar, TuningConfig
from dpfair.tuning.job import (
    TuningJob,
    TuningResult,
    allowed_names,
    check_space_names,
    check_space_values,
    dump,
    grid_points,
    make_config,
    params_key,
    resolve,
    seed_of_run,
)
from dpfair.tuning.search_events import combine_run_events, planned_run_event, search_event
from dpfair.tuning.study import load_study, make_storage, open_study
from dpfair.tuning.trial_records import best_run, guarantee, is_run, settled_trials, trial_row
from dpfair.tuning.worker import run_worker, spawn_workers

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from dpfair.tuning import protocols as p  # the types a search takes and hands back

__all__ = ["finish", "prepare", "tune"]

_MAX_GRID = 200_000


def tune(method_cfg: p.MethodSpec, train_cfg_base: p.RunConfig, dataset: p.DatasetLike,
         tuning_cfg: TuningConfig | Mapping[str, object], train_fn: p.TrainFn | str | None = None,
         **hooks: Unpack[p.SearchHooks]) -> TuningResult:
    """Search ``tuning_cfg.space`` for ``method_cfg`` trained per ``train_cfg_base``.

    ``train_fn(config, dataset)`` (default :func:`dpfair.training.train`) returns an object
    with ``val_predictions`` (``y_true``, ``y_pred``, ``groups``, ``loss``) and either
    ``event`` or TrainResult's ``sample_rate``/``sigma``/``steps``/``count_sigma``. The
    keyword ``hooks`` (``allowed``, ``event_fn``, ``on_trial``) are those of
    :class:`~dpfair.tuning.protocols.SearchHooks`. Errors (bad space, eta, mu, budget, storage)
    are raised before any training. Calling ``tune`` again on the same study resumes it.
    """
    job = prepare(method_cfg, train_cfg_base, dataset, tuning_cfg, train_fn, **hooks)
    best_result = None
    if job.cfg.workers > 1:
        spawn_workers(job, job.cfg.workers)
    else:
        best_result = run_worker(job, 0, keep_best=True)
    result = finish(job)
    if best_result is not None and result.best_trial == best_result[0]:
        result.best_result = best_result[1]
    return result


def prepare(method_cfg: p.MethodSpec, train_cfg_base: p.RunConfig, dataset: p.DatasetLike,
            tuning_cfg: TuningConfig | Mapping[str, object],
            train_fn: p.TrainFn | str | None = None, *, allowed: Collection[str] | None = None,
            event_fn: p.EventFn | str | None = None, on_trial: p.OnTrial | str | None = None,
            ) -> TuningJob:
    """Validate everything (the space's names and each value, a non-empty validation split,
    ``tuning.delta`` < 1/n_train, the workers), account the search, check the budget, create
    (or reopen) the study and draw (or read back) K. No training happens here; the arguments
    are :func:`tune`'s."""
    cfg = tuning_cfg if isinstance(tuning_cfg, TuningConfig) else _validate_cfg(tuning_cfg)
    if train_fn is None and event_fn is None:
        method_cfg, train_cfg_base = _train_configs(method_cfg, train_cfg_base)
    names = list(allowed) if allowed is not None else allowed_names(method_cfg, train_cfg_base)
    check_space_names(cfg.space, names, method_cfg)
    check_space_values(cfg.space, method_cfg, train_cfg_base)
    _check_validation_split(dataset)
    _check_workers(cfg, train_fn=train_fn, event_fn=event_fn, on_trial=on_trial)
    delta = cfg.delta
    if delta is None:
        delta = float(dump(train_cfg_base).get("delta", 1e-6) or 1e-6)
    else:
        _check_search_delta(delta, dataset, train_cfg_base)
    event_of = resolve(event_fn) if event_fn is not None else planned_run_event
    grid = _grid(cfg)
    planned, run = _plan_events(grid, method_cfg, train_cfg_base, dataset, event_of, cfg)
    search = search_event(cfg, run)
    train_spend = accounting.spend(run, delta)
    search_spend = accounting.spend(search or dp_event.NonPrivateDpEvent(), delta)
    eps_train, eps_search = train_spend.epsilon, search_spend.epsilon
    if cfg.budget_epsilon is not None and not eps_search <= cfg.budget_epsilon:
        why = (
            "grid mode has no privacy guarantee for the search"
            if cfg.mode == "grid"
            else f"mode {cfg.mode}"
        )
        raise BudgetExceededError(
            f"the search would spend epsilon {eps_search:.4g} ({search_spend.accountant}) at "
            f"delta {delta:g} ({why}; one training run alone: {eps_train:.4g}, "
            f"{train_spend.accountant}), over the budget {cfg.budget_epsilon:g}. "
            "Lower mu, raise sigma/sigma_score, or shorten training. Nothing was run."
        )

    method_name = dump(method_cfg).get("name", "method")
    study_name = cfg.study_name or f"dpfair-{method_name}-{getattr(dataset, 'name', 'data')}"
    storage, storage_desc = make_storage(cfg)
    job = TuningJob(
        method_cfg=method_cfg, train_cfg_base=train_cfg_base, dataset=dataset, cfg=cfg,
        train_fn=train_fn, event_fn=event_fn, on_trial=on_trial, allowed=names,
        study_name=study_name, storage_desc=storage_desc,
        run_event_json=accounting.event_to_json(run), planned=planned,
        search_event_json=accounting.event_to_json(search) if search is not None else None,
        epsilon_training=eps_train, epsilon_search=eps_search, delta=delta,
    )
    job.k = open_study(job, storage, len(grid))
    return job


def finish(
    job: TuningJob, best_result: p.RunOutcome | None = None, poll: float = 0.5
) -> TuningResult:
    """Wait until no run is RUNNING (failing stale ones), then select the best run."""
    cfg = job.cfg
    trials = settled_trials(load_study(job), job.k, cfg.grace, poll)
    n_runs = sum(is_run(t, job.k) for t in trials)
    if n_runs < job.k:
        raise TuningError(
            f"study {job.study_name!r}: only {n_runs} of K={job.k} runs were started "
            "(workers exited early); call tune() again to resume"
        )
    best_t = best_run(trials, job.k, minimize=cfg.minimize)
    best_params = None
    best_config = None
    if best_t is not None:
        best_params = {k: v for k, v in best_t.params.items() if k != "_"}
        best_config = make_config(
            job.method_cfg,
            job.train_cfg_base,
            best_params,
            best_t.user_attrs.get("dpfair.seed", seed_of_run(cfg.seed, best_t.number)),
            reproducible=cfg.reproducible,
        )
    return TuningResult(
        best_config=best_config, best_params=best_params,
        best_score=best_t.value if best_t is not None else None,
        best_trial=best_t.number if best_t is not None else None,
        K=job.k, n_runs=n_runs, trials=[trial_row(t, job.k, cfg.tuning_privacy) for t in trials],
        epsilon_training=job.epsilon_training, epsilon_search=job.epsilon_search, delta=job.delta,
        event_json=job.search_event_json, run_event_json=job.run_event_json,
        tuning_privacy=cfg.tuning_privacy, score_privacy=cfg.score_privacy, score=cfg.score,
        study_name=job.study_name, storage=job.storage_desc,
        privacy_guarantee=guarantee(trials, job.k), best_result=best_result,
        reproducible=cfg.reproducible,
    )


def _validate_cfg(data: Mapping[str, object]) -> TuningConfig:
    try:
        return TuningConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise TuningError(format_validation_error(exc, TuningConfig, ("tuning",))) from None


def _check_validation_split(dataset: p.DatasetLike) -> None:
    """Every run is scored on the validation split: an empty one would select on noise."""
    labels = getattr(getattr(dataset, "val", None), "y", None)
    if labels is not None and len(labels) == 0:
        name = getattr(dataset, "name", "<name>")
        raise TuningError(
            f"dataset {name!r} has an empty validation split, so a search would select its "
            f"configuration from noise alone: set datasets.{name}.validation_fraction above 0 "
            "(e.g. 0.1). Nothing was run."
        )


def _check_search_delta(delta: float, dataset: p.DatasetLike, train_cfg_base: p.RunConfig) -> None:
    """``tuning.delta`` < 1/n_train, as every training run's delta
    (:func:`dpfair.training.run_plan.check_delta`; its opt-out is the training config's)."""
    labels = getattr(getattr(dataset, "train", None), "y", None)
    if labels is None:
        return
    from dpfair.training.run_plan import check_delta  # imports torch: only when there is data

    allowed = bool(dump(train_cfg_base).get("allow_large_delta", False))
    check_delta(delta, len(labels), allowed=allowed, key="tuning.delta",
                opt_out="experiment.train.allow_large_delta")


def _check_workers(cfg: TuningConfig, **functions: object) -> None:
    """Several workers need a multi-process storage and functions they can import."""
    if cfg.workers == 1:
        return
    storage_url = cfg.storage or "sqlite"
    if not (storage_url.startswith("journal:") or storage_url.split(":")[0].startswith("postgres")):
        raise TuningError(
            "several workers need storage 'journal:PATH' (one machine) or a postgresql:// URL "
            "(SQLite is single-process)"
        )
    for what, fn in functions.items():
        try:
            pickle.dumps(fn)
        except Exception as exc:
            raise TuningError(
                f"{what} must be importable for worker processes (a module-level function "
                f"or a 'module:function' / '/path/file.py:function' string): {exc}"
            ) from None


def _train_configs(method_cfg: p.MethodSpec, train_cfg_base: p.RunConfig
                   ) -> tuple[p.MethodSpec, p.RunConfig]:
    """With dpfair's own training (no ``train_fn``/``event_fn``), mappings validated into a
    :class:`~dpfair.training.TrainConfig` and its method, as the types allow them; a
    ``ConfigError`` names a bad key."""
    if isinstance(method_cfg, BaseModel) and isinstance(train_cfg_base, BaseModel):
        return method_cfg, train_cfg_base
    from dpfair.training import TrainConfig

    try:
        config = TrainConfig.model_validate({**dump(train_cfg_base), "method": dump(method_cfg)})
    except ValidationError as exc:
        raise ConfigError("tune: " + format_validation_error(exc, TrainConfig)) from None
    return config.method, config


def _grid(cfg: TuningConfig) -> list[dict[str, Scalar]]:
    """Every point of the space (one empty point for an empty space)."""
    size = math.prod(len(values) for values in cfg.space.values())
    if size > _MAX_GRID:
        raise TuningError(f"the space has {size} configurations (> {_MAX_GRID:,}): make it smaller")
    return grid_points(cfg.space)


def _plan_events(
    grid: list[dict[str, Scalar]],
    method_cfg: p.MethodSpec,
    train_cfg_base: p.RunConfig,
    dataset: p.DatasetLike,
    event_of: p.EventFn,
    cfg: TuningConfig,
) -> tuple[dict[str, str], dp_event.DpEvent]:
    """Every configuration's predicted training event (JSON, by :func:`params_key`; this also
    validates every config) and the per-run event covering them all."""
    planned: dict[str, str] = {}
    events = []
    for params in grid:
        try:
            config = make_config(
                method_cfg, train_cfg_base, params, seed=0, reproducible=cfg.reproducible
            )
        except Exception as exc:
            raise TuningError(f"configuration {params} is invalid: {exc}") from exc
        ev = event_of(config, dataset)
        planned[params_key(params)] = accounting.event_to_json(ev)
        events.append(ev)
    return planned, combine_run_events(events)
