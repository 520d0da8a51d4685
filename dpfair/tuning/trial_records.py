"""The search's trial records: the study's trials, which of them count as runs, dead workers.

(The privacy spend is the gate's, :mod:`dpfair.ledger`; these records say which trials a
search's K counts. The attribute ``dpfair.ledger`` keeps its name so stored studies resume.)

Run slots are claimed atomically by the storage's trial numbering: a worker asks for a trial
(``study.ask``); trial numbers are assigned by the storage (RDB: under a row lock on the
study; journal: by log order), so they are unique. **A trial is a run if and only if its number
is < K and it has left the WAITING state** — every such trial was started and counts, whether
it completed, crashed (FAIL, ``dpfair.error`` holds the error) or was left RUNNING by a dead
worker (failed as stale, ``dpfair.failed_by: "stale"``). A worker that gets number ≥ K
(another worker claimed the last slot between its count and its ask) marks it
``dpfair.ledger: "excess"`` and PRUNED at once, without training: excess trials never ran and
never count. Run trials carry ``dpfair.ledger: "run"`` (set right after the ask; the rule above
holds even if a worker dies before setting it). User attrs of a run: ``dpfair.config`` (JSON),
``dpfair.seed``, ``dpfair.score``, ``dpfair.event`` (the run's event JSON), ``dpfair.worker``,
``dpfair.host``, ``dpfair.pid``, ``dpfair.heartbeat``.

Dead workers: while a trial runs its worker writes ``dpfair.heartbeat`` (a timestamp) every
``heartbeat_interval`` s, and on RDB storages also Optuna's heartbeat. Before claiming a slot
and when finishing, a worker fails stale trials: Optuna's ``fail_stale_trials`` (RDB) and, for
every storage (JournalStorage has no Optuna heartbeat), a RUNNING trial whose last
``dpfair.heartbeat`` (or start, if it never beat) is older than ``grace_period`` s. Stale runs
count.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Sequence
from typing import TypedDict

import optuna
from optuna.trial import FrozenTrial, TrialState

from dpfair.processes import uninterrupted
from dpfair.tuning.config import Scalar

__all__ = [
    "HEARTBEAT",
    "Heartbeat",
    "TrialRow",
    "best_run",
    "fail_stale",
    "guarantee",
    "is_run",
    "trial_row",
    "settled_trials",
]

HEARTBEAT = "dpfair.heartbeat"


class TrialRow(TypedDict):
    """One trial of the study, as results and ``on_trial`` see it."""

    number: int
    state: str
    ledger: str  # "run" or "excess"
    params: dict[str, Scalar]
    config: str | None
    seed: int | None
    score: float | None
    event: str | None
    worker: int | None
    host: str | None
    error: str | None
    privacy_guarantee: str | None
    failed_by: str | None
    tuning_privacy: str


def is_run(t: FrozenTrial, k: int) -> bool:
    """Whether trial ``t`` counts as a run of a search with K = ``k`` (module doc)."""
    return t.number < k and t.state != TrialState.WAITING


def trial_row(t: FrozenTrial, k: int, tuning_privacy: str) -> TrialRow:
    """The record of trial ``t``."""
    ua = t.user_attrs
    return {
        "number": t.number,
        "state": t.state.name,
        "ledger": "run" if is_run(t, k) else "excess",
        "params": dict(t.params),
        "config": ua.get("dpfair.config"),
        "seed": ua.get("dpfair.seed"),
        "score": t.value if t.state == TrialState.COMPLETE else None,
        "event": ua.get("dpfair.event"),
        "worker": ua.get("dpfair.worker"),
        "host": ua.get("dpfair.host"),
        "error": ua.get("dpfair.error"),
        "privacy_guarantee": ua.get("dpfair.privacy_guarantee"),
        "failed_by": ua.get("dpfair.failed_by")
        or ("stale" if t.state == TrialState.FAIL and "dpfair.error" not in ua else None),
        "tuning_privacy": tuning_privacy,
    }


def guarantee(trials: Sequence[FrozenTrial], k: int) -> str | None:
    """The weakest privacy guarantee the runs reported (``heuristic`` wins), or None."""
    found = {t.user_attrs.get("dpfair.privacy_guarantee") for t in trials if is_run(t, k)}
    found.discard(None)
    if not found:
        return None
    return "heuristic" if "heuristic" in found else sorted(found)[0]


def best_run(trials: Sequence[FrozenTrial], k: int, minimize: bool) -> FrozenTrial | None:
    """The completed run with the best score (ties: see the key), or None."""
    done = [
        t for t in trials if is_run(t, k) and t.state == TrialState.COMPLETE and t.value is not None
    ]
    if not done:
        return None
    pick = min if minimize else max
    return pick(done, key=lambda t: (t.value, -t.number))


def _optuna_heartbeat(storage: optuna.storages.BaseStorage) -> bool:
    """Whether ``storage`` has Optuna's heartbeat switched on (RDBStorage with an interval)."""
    get = getattr(storage, "get_heartbeat_interval", None)
    return get is not None and get() is not None


class Heartbeat:
    """Writes ``dpfair.heartbeat`` (and Optuna's heartbeat on RDB storages) every interval."""

    def __init__(self, storage: optuna.storages.BaseStorage, trial_id: int, interval: float):
        self._storage, self._trial_id, self._interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def beat(self) -> None:
        """Write one heartbeat now."""
        self._storage.set_trial_user_attr(self._trial_id, HEARTBEAT, time.time())
        if _optuna_heartbeat(self._storage):
            self._storage.record_heartbeat(self._trial_id)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            with contextlib.suppress(Exception):  # a finished trial refuses attrs: just stop
                self.beat()

    def __enter__(self) -> Heartbeat:
        with uninterrupted():  # a write: see dpfair.tuning.worker._record
            self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def fail_stale(study: optuna.Study, grace: float) -> list[int]:
    """Fail RUNNING trials of dead workers (module doc); returns their numbers."""
    storage = study._storage
    now = time.time()
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        last = t.user_attrs.get(HEARTBEAT)
        if last is None and t.datetime_start is not None:
            last = t.datetime_start.timestamp()
        if last is None or now - float(last) <= grace:
            continue
        with contextlib.suppress(Exception):
            storage.set_trial_user_attr(t._trial_id, "dpfair.failed_by", "stale")
        try:
            if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                failed.append(t.number)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
    with warnings.catch_warnings():  # Optuna's own check (RDB storages), same grace period
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    return failed


def settled_trials(study: optuna.Study, k: int, grace: float, poll: float) -> list[FrozenTrial]:
    """Every trial of ``study`` once no run is RUNNING (failing stale ones, every ``poll`` s)."""
    while True:
        fail_stale(study, grace)
        trials = study.get_trials(deepcopy=True)
        if not any(t.state == TrialState.RUNNING for t in trials if is_run(t, k)):
            return trials
        time.sleep(poll)
