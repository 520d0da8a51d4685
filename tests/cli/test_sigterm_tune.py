"""SIGTERM of `dpfair tune` (a real signal to the command's process) while a trial trains, in
the command's process or in spawned workers (which the command then ends with SIGTERM): the
process ends with 143, every trial in flight is told FAIL with the reason (never left
RUNNING), no trial starts after the signal (in spawned workers: after theirs), and the
search's ledger release is settled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import yaml

from dpfair.ledger import SourceLedger
from dpfair.workspace import open_racing


def _params(folder: Path) -> None:
    params = {
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {
            "dataset": "synthetic", "model": {"name": "logistic_regression"},
            "train": {"epochs": 5000, "batch_size": 50, "lr": 0.5, "sigma": 1.0,
                      "delta": 1e-5, "progress": False},  # a trial that would take long
            "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0]},
        "tuning": {"mode": "fixed", "n_runs": 3, "spaces": {"dpsgd": {"lr": [0.1, 0.5]}}},
        "tracking": {"uri": f"sqlite:///{folder / 'm.db'}", "artifact_root": str(folder / "a")},
    }
    (folder / "params.yaml").write_text(yaml.safe_dump(params))


def _storage(folder: Path, workers: int) -> optuna.storages.BaseStorage:
    """The study's storage: SQLite for one worker, a journal file for several. The SQLite
    file is opened as dpfair opens it (:func:`dpfair.workspace.open_racing`: under its lock),
    so that this poll never creates Optuna's schema while the command is creating it."""
    if workers == 1:
        url = f"sqlite:///{folder / 'optuna.db'}"
        return open_racing(lambda: optuna.storages.RDBStorage(url), url)
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(folder / "optuna.journal")))


def _trials(folder: Path, workers: int) -> list[optuna.trial.FrozenTrial]:
    """The study's trials so far (none before the study exists)."""
    if not (folder / ("optuna.db" if workers == 1 else "optuna.journal")).exists():
        return []
    try:
        return optuna.load_study(study_name="s", storage=_storage(folder, workers)
                                 ).get_trials(deepcopy=False)
    except (KeyError, optuna.exceptions.StorageInternalError):  # not created yet
        return []


@pytest.mark.parametrize("workers", [1, 2])  # in the command's process; spawned workers
def test_sigterm_of_tune_leaves_no_trial_running_and_starts_none(tmp_path: Path,
                                                                 workers: int) -> None:
    _params(tmp_path)
    storage = [] if workers == 1 else ["--storage", "journal:optuna.journal"]
    proc = subprocess.Popen([sys.executable, "-m", "dpfair.cli", "tune", "--method", "dpsgd",
                             "--study", "s", "--workers", str(workers), *storage], cwd=tmp_path,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not [t for t in _trials(tmp_path, workers) if t.state.name == "RUNNING"]:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no trial started: {proc.communicate()[0][-3000:]}")
        time.sleep(0.2)
    signalled = datetime.now()  # Optuna's trial times are naive local times
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    trials = _trials(tmp_path, workers)
    # every trial held at the signal (one per worker) FAIL with the reason, none RUNNING
    assert trials and {t.state.name for t in trials} == {"FAIL"}, [(t.state, t.user_attrs)
                                                                   for t in trials]
    assert all(t.user_attrs["dpfair.error"].startswith("stopped (Terminated)")
               for t in trials), [t.user_attrs for t in trials]
    if workers == 1:  # spawned workers hear of it by their own SIGTERM, a moment later
        assert all(t.datetime_start is not None and t.datetime_start <= signalled
                   for t in trials)
    [search] = SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases()
    assert search.status == "failed", search
