"""The flow tests' workspaces; PREFECT_HOME in a temp dir (the session's Prefect server is
``tests.conftest.prefect_harness``); library tests never touch Prefect."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
import yaml

os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="dpfair-prefect-home-")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def seed_home(home: Path) -> Path:
    """``home`` (a ``PREFECT_HOME``) with its database copied from Prefect's empty one, as
    ``make install`` leaves a new home's (``flows.server.empty_database``), unless it has one:
    a server started there skips the migrations."""
    from dpfair.user_cache import copy_sqlite
    from flows.server import empty_database

    home.mkdir(parents=True, exist_ok=True)
    if not (home / "prefect.db").exists():
        copy_sqlite(empty_database(), home / "prefect.db")
    return home


def make_workspace(root: Path, repo: Path, experiment: dict, tuning: dict | None = None,
                   **sections: dict) -> Path:
    """A temp copy of what `dvc repro` needs (dvc.yaml, bin, .dvc, dpfair/data) plus params.yaml
    (whose budget allows the non-private reference unless ``budget`` says otherwise)."""
    shutil.copy(repo / "dvc.yaml", root / "dvc.yaml")
    shutil.copytree(repo / "bin", root / "bin")  # the stage commands' interpreter
    shutil.copytree(repo / ".dvc", root / ".dvc",
                    ignore=shutil.ignore_patterns("tmp", "cache"))
    (root / ".dvc" / "config.local").write_text("[core]\n    no_scm = true\n")  # not git
    shutil.copytree(repo / "dpfair" / "data", root / "dpfair" / "data",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "data" / "raw").mkdir(parents=True, exist_ok=True)  # the prepare stages' dependency
    params = {
        "datasets": {"synthetic": {"n": 800, "n_features": 6, "minority_fraction": 0.2}},
        "experiment": experiment,
        "tuning": tuning or {},
        "budget": {"allow_nonprivate_reference": True},
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}",
                     "artifact_root": str(root / "mlartifacts")},
        **sections,
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root / "params.yaml"


SMALL_EXPERIMENT = {
    "dataset": "synthetic",
    "model": {"name": "logistic_regression"},
    "train": {"epochs": 3, "batch_size": 64, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
              "progress": False},
    "methods": {"dpsgd": {"C": 1.0}, "dpsgd_global": {"C0": 1.0, "Z": 5.0}},
    "seeds": [0, 1],
}


def final_runs(db: Path) -> set[tuple[str, str]]:
    """(method, status) of the final training runs in the MLflow store ``db``."""
    if not db.exists():
        return set()
    try:
        with sqlite3.connect(db) as con:
            return set(con.execute(
                "select m.value, r.status from runs r join tags s on r.run_uuid = s.run_uuid "
                "join tags m on r.run_uuid = m.run_uuid where s.key = 'dpfair.stage' and "
                "s.value = 'final' and m.key = 'dpfair.method'").fetchall())
    except sqlite3.Error:  # tables not created yet
        return set()


def fail_training_of(monkeypatch: pytest.MonkeyPatch, method: str,
                     error: Exception | None = None) -> None:
    """Every training of ``method`` raises ``error`` (default: a RuntimeError, a bug)
    mid-pipeline; the other methods train as usual (``monkeypatch.undo()`` or setting
    ``method_steps.train`` back ends it)."""
    from dpfair.pipeline import method_steps

    real_train = method_steps.train

    def train_or_fail(config, dataset, callbacks=()):
        if config.method.name == method:
            raise error or RuntimeError("boom in the middle of training")
        return real_train(config, dataset, callbacks)

    monkeypatch.setattr(method_steps, "train", train_or_fail)
