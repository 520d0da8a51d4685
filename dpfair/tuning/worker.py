"""A tuning worker: claim run slots of the study and train, until K runs are claimed.

One process runs :func:`run_worker` in-process; ``workers=N`` (N > 1) spawns N processes
``python -m dpfair.tuning worker SPEC INDEX --parent PID`` (SPEC: the job pickled by
:func:`write_spec` into a temporary folder ``dpfair-tuning-<owner pid>-*``, removed on every
exit, SIGTERM included; one left by a killed owner is removed by the next start of any command,
:func:`dpfair.processes.remove_stale_job_dirs`). A spawned worker dies with its owner
(:func:`dpfair.processes.die_with_parent`) and starts no trial once it is gone.
How slots are claimed and what counts as a run: :mod:`dpfair.tuning.trial_records`. After each run
the event the trainer reports must equal the one the search was accounted with, else the
tuning stops with an error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from dpfair import accounting
from dpfair.processes import (
    JOB_DIR_PREFIX,
    parent_gone,
    remove_stale_job_dirs,
    sigterm_raises,
    stop_requested,
    uninterrupted,
)
from dpfair.tuning.job import TuningJob, config_json, make_config, params_key, resolve, seed_of_run
from dpfair.tuning.score import n_classes_groups, release_score, score_rng
from dpfair.tuning.search_events import result_event
from dpfair.tuning.study import distributions, load_study, sampler_for, search_space
from dpfair.tuning.trial_records import Heartbeat, fail_stale, is_run, trial_row

if TYPE_CHECKING:
    from dpfair.data.dataset import GroupedDataset
    from dpfair.training import TrainConfig, TrainResult
    from dpfair.tuning.config import Scalar
    from dpfair.tuning.protocols import PredictionsLike, RunOutcome, TrainFn

__all__ = ["remove_stale_job_dirs", "run_worker", "spawn_workers", "write_spec"]

_log = logging.getLogger(__name__)


class _AccountingMismatch(RuntimeError):
    """A run reported another event than the one the search was accounted with."""


def run_worker(
    job: TuningJob, index: int = 0, *, keep_best: bool = False, parent: int | None = None
) -> tuple[int, RunOutcome] | None:
    """Claim and run trials until K runs are claimed (see :mod:`dpfair.tuning.trial_records`). With
    ``keep_best`` returns ``(trial number, train_fn result)`` of this worker's best run (else
    None). Before each claim: no new trial once this process was told to stop (SIGTERM,
    :func:`~dpfair.processes.stop_requested`) or, for a spawned worker, once the ``parent``
    that started it is gone."""
    cfg = job.cfg
    study = load_study(job)
    study.sampler = sampler_for(cfg, index, study)
    dists = distributions(search_space(cfg))
    train_fn = resolve(job.train_fn) if job.train_fn is not None else _default_train_fn
    on_trial_fn = resolve(job.on_trial) if job.on_trial is not None else None
    best: tuple[float, int, RunOutcome] | None = None
    sign = -1.0 if cfg.minimize else 1.0
    while not (stop_requested() or parent_gone(parent)):
        ran = _claim_and_run(study, job, dists, index, train_fn)
        if ran is None:
            break
        trial, outcome = ran
        if outcome is None:
            continue
        value, result = outcome
        try:
            with uninterrupted():
                study.tell(trial, value)
        except Exception as exc:  # failed as stale meanwhile (a paused worker): counts, no score
            _log.warning("trial %d could not be completed: %r", trial.number, exc)
            continue
        if on_trial_fn is not None:
            try:
                frozen = study._storage.get_trial(trial._trial_id)
                on_trial_fn(trial_row(frozen, job.k, cfg.tuning_privacy), result)
            except Exception as exc:
                _log.warning("on_trial failed for trial %d: %r", trial.number, exc)
        if keep_best and (best is None or sign * value > sign * best[0]):
            best = (value, trial.number, result)
    return (best[1], best[2]) if best is not None else None


def _claim(
    study: optuna.Study, job: TuningJob, dists: Mapping[str, CategoricalDistribution]
) -> optuna.Trial | None:
    """The next run slot, or None once K runs are claimed (a trial numbered ≥ K is marked
    excess and pruned)."""
    fail_stale(study, job.cfg.grace)
    trials = study.get_trials(deepcopy=False)
    if sum(is_run(t, job.k) for t in trials) >= job.k:
        return None
    with warnings.catch_warnings():  # "heartbeat is supposed to be used with optimize":
        warnings.simplefilter("ignore", UserWarning)  # we beat ourselves (Heartbeat)
        trial = study.ask(fixed_distributions=dict(dists))
    if trial.number >= job.k:
        trial.set_user_attr("dpfair.ledger", "excess")
        study.tell(trial, state=TrialState.PRUNED)
        return None
    return trial


def _claim_and_run(
    study: optuna.Study, job: TuningJob, dists: Mapping[str, CategoricalDistribution],
    index: int, train_fn: TrainFn
) -> tuple[optuna.Trial, tuple[float, RunOutcome] | None] | None:
    """Claim the next run slot (:func:`_claim`; None once K runs are claimed) and run it
    (:func:`_run`). Stopped (SIGTERM, Ctrl-C) while it holds a trial, the trial is told FAIL
    (it counts), never left RUNNING: the claim is uninterrupted, so a SIGTERM that arrives
    while the trial is asked for is raised once it is held."""
    trial = None
    try:
        with uninterrupted():
            trial = _claim(study, job, dists)
        return None if trial is None else (trial, _run(study, trial, job, index, train_fn))
    except BaseException as exc:
        if trial is not None and not isinstance(exc, Exception):  # _run fails its errors
            _fail(study, trial, f"stopped ({type(exc).__name__}) before the run ended")
        raise


def _run(
    study: optuna.Study, trial: optuna.Trial, job: TuningJob, index: int, train_fn: TrainFn
) -> tuple[float, RunOutcome] | None:
    """Label ``trial`` as a run of worker ``index``, train and score it under a heartbeat.
    A failed run is told FAIL (it counts) and gives None; an accounting mismatch is raised."""
    cfg = job.cfg
    params = {k: v for k, v in trial.params.items() if k != "_"}
    seed = seed_of_run(cfg.seed, trial.number)
    try:
        _record(trial, {"dpfair.ledger": "run", "dpfair.tuning_privacy": cfg.tuning_privacy,
                        "dpfair.seed": seed, "dpfair.worker": index,
                        "dpfair.host": socket.gethostname(), "dpfair.pid": os.getpid()})
        with Heartbeat(study._storage, trial._trial_id, cfg.heartbeat_interval):
            return _train_and_score(trial, job, params, seed, train_fn)
    except Exception as exc:
        _log.warning("tuning trial %d failed (it counts as a run): %r", trial.number, exc)
        _fail(study, trial, f"{type(exc).__name__}: {exc}")
        if isinstance(exc, _AccountingMismatch):
            raise
        return None


def _record(trial: optuna.Trial, attrs: Mapping[str, object]) -> None:
    """Write ``attrs`` to ``trial``, uninterrupted: a SIGTERM that cuts a write while it waits
    for Optuna's journal-file lock makes Optuna remove the lock another process holds (or raise
    ``RuntimeError: did not possess lock`` when that process let it go meanwhile), so the
    signal is raised once the write is done."""
    with uninterrupted():
        for key, value in attrs.items():
            trial.set_user_attr(key, value)


def _fail(study: optuna.Study, trial: optuna.Trial, error: str) -> None:
    """Tell ``trial`` FAIL (it counts as a run) with ``error`` in its ``dpfair.error``."""
    with uninterrupted():  # a second SIGTERM does not cut the write
        with contextlib.suppress(Exception):
            trial.set_user_attr("dpfair.error", error[:2000])
        with contextlib.suppress(Exception):  # already failed as stale: it stays FAIL
            study.tell(trial, state=TrialState.FAIL)


def _train_and_score(trial: optuna.Trial, job: TuningJob, params: dict[str, Scalar],
                     seed: int, train_fn: TrainFn) -> tuple[float, RunOutcome]:
    """Train the run of ``trial`` and release its score (the accounted event checked)."""
    cfg = job.cfg
    config = make_config(
        job.method_cfg, job.train_cfg_base, params, seed, reproducible=cfg.reproducible
    )
    _record(trial, {"dpfair.config": config_json(config)})
    result = train_fn(config, job.dataset)
    event_json = accounting.event_to_json(result_event(result))
    attrs = {"dpfair.event": event_json}
    if (guarantee := getattr(result, "privacy_guarantee", None)) is not None:
        attrs["dpfair.privacy_guarantee"] = str(guarantee)
    _record(trial, attrs)
    planned = job.planned.get(params_key(params))
    if event_json != planned:
        raise _AccountingMismatch(
            f"trial {trial.number}: the run reports event {event_json} but the "
            f"search was accounted with {planned}"
        )
    pred = _val_predictions(result)
    n_classes, n_groups = n_classes_groups(job.dataset, pred)
    value = release_score(
        pred,
        cfg.score,
        n_classes,
        n_groups,
        cfg.sigma_score if cfg.score_privacy == "noisy" else None,
        cfg.loss_clip,
        score_rng(cfg, trial.number),
        cfg.constraint,
    )
    _record(trial, {"dpfair.score": value})
    return value, result


def _val_predictions(result: RunOutcome | Mapping[str, PredictionsLike]) -> PredictionsLike:
    return result["val_predictions"] if isinstance(result, Mapping) else result.val_predictions


def _default_train_fn(config: TrainConfig, dataset: GroupedDataset) -> TrainResult:
    from dpfair.training import train

    if hasattr(config, "progress"):
        config = config.model_copy(update={"progress": False})
    return train(config, dataset)


def write_spec(job: TuningJob, path: str | Path) -> Path:
    """Pickle ``job`` for ``python -m dpfair.tuning worker PATH INDEX``."""
    path = Path(path)
    path.write_bytes(pickle.dumps(job))
    return path


def spawn_workers(job: TuningJob, n: int) -> list[int]:
    """Run ``n`` worker processes on ``job`` and wait for them; returns their exit codes. If
    this process is interrupted (an exception, or SIGTERM where it can be caught) the workers
    are terminated; the job's temporary folder is removed on every exit."""
    remove_stale_job_dirs()
    tmp = Path(tempfile.mkdtemp(prefix=f"{JOB_DIR_PREFIX}{os.getpid()}-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with sigterm_raises():
            spec = write_spec(job, tmp / "job.pkl")
            for i in range(n):  # one by one: a failed start still ends those started
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "dpfair.tuning", "worker", str(spec), str(i),
                     "--parent", str(os.getpid())]))
            codes = [p.wait() for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    if any(codes):
        _log.warning("tuning worker exit codes: %s", codes)
    return codes
