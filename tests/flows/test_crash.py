"""kill -9 of a pipeline run in the middle of a training, then a rerun: the rerun marks the
killed runs FAILED, stops the killed run's Prefect temporary server, finishes, and
`dpfair results` reads it (DESIGN.md section 7; issue: clean up after crashes)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from dpfair.config import load_params
from dpfair.processes import alive
from dpfair.tracking import read_results
from flows.server import marked_owner
from tests.flows.conftest import SMALL_EXPERIMENT, make_workspace

pytestmark = pytest.mark.slow

_RUN = "import sys; from flows.experiment import run_experiment; run_experiment(*sys.argv[1:])"


def _training_started(db: Path) -> bool:
    """Whether a final training run is RUNNING in the MLflow store ``db``."""
    if not db.exists():
        return False
    try:
        with sqlite3.connect(db) as con:
            return bool(con.execute(
                "select 1 from runs join tags on runs.run_uuid = tags.run_uuid where "
                "runs.status = 'RUNNING' and tags.key = 'dpfair.stage' and "
                "tags.value = 'final'").fetchone())
    except sqlite3.Error:  # tables not created yet
        return False


def _servers_of(owner: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if p.name.isdigit() and marked_owner(int(p.name)) == owner]


def test_kill_9_during_training_then_rerun(prefect_harness, tmp_path, repo_root, monkeypatch):
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    slow = {**SMALL_EXPERIMENT, "seeds": [0], "methods": {"dpsgd": {"C": 1.0}},
            "train": {**SMALL_EXPERIMENT["train"], "epochs": 400}}
    params_path = make_workspace(tmp_path, repo_root, slow)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")  # its own temporary server
    proc = subprocess.Popen([sys.executable, "-c", _RUN, str(params_path), str(tmp_path)],
                            cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 300
        while not _training_started(tmp_path / "mlflow.db"):
            assert proc.poll() is None, "the run ended before any training started"
            assert time.monotonic() < deadline, "no training started in 300 s"
            time.sleep(0.2)
        orphans = _servers_of(proc.pid)
        assert orphans  # the run's temporary server
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert all(alive(pid) for pid in orphans)  # SIGKILL left it behind
    params = load_params(params_path)
    client = MlflowClient(params.tracking.uri)
    running = {r.info.run_id for r in client.search_runs(
        [client.get_experiment_by_name("dpfair-synthetic").experiment_id],
        "attributes.status = 'RUNNING'")}
    assert len(running) >= 2  # the pipeline run and its training
    with pytest.raises(LookupError):
        read_results(params.tracking)

    fast = yaml.safe_load(params_path.read_text())
    fast["experiment"]["train"]["epochs"] = 2
    params_path.write_text(yaml.safe_dump(fast, sort_keys=False))
    out = run_experiment(str(params_path), str(tmp_path))

    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in orphans) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in orphans)
    runs = client.search_runs([out["experiment_id"]], max_results=1000)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    for run_id in running:
        killed = client.get_run(run_id)
        assert killed.info.status == "FAILED" and "dpfair.stale" in killed.data.tags
    assert read_results(params.tracking) == (out["parent_run_id"], out["table"])
