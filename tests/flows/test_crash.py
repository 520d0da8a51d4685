"""kill -9 of a pipeline run in the middle of a training, then a rerun: the rerun marks the
killed runs FAILED, stops the killed run's Prefect temporary server, finishes, and
`dpfair results` reads it. SIGTERM in the middle of the final trainings: the trainings in
progress stop at their next step and end FAILED, no queued training starts after the signal,
the pipeline run ends FAILED, its ledger release is settled, and the server stops with the
process (issue: clean up after crashes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from dpfair.config.params import load_params
from dpfair.processes import alive
from dpfair.tracking.runs import read_results
from flows.server import marked_owner
from tests.flows.conftest import SMALL_EXPERIMENT, final_runs, make_workspace

pytestmark = pytest.mark.slow

_RUN = "import sys; from flows.experiment import run_experiment; run_experiment(*sys.argv[1:])"


def _training_started(db: Path) -> bool:
    """Whether a final training run is RUNNING in the MLflow store ``db``."""
    return any(status == "RUNNING" for _, status in final_runs(db))


def _servers_of(owner: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if p.name.isdigit() and marked_owner(int(p.name)) == owner]


def _run_until_training(tmp_path: Path, repo_root: Path, epochs: int = 400,
                        seeds: tuple[int, ...] = (0,)
                        ) -> tuple[Path, subprocess.Popen[bytes], list[int]]:
    """Start `dpfair run` (a subprocess with its own temporary Prefect server) on a slow
    training per seed; once a training runs, returns ``(params path, process, its server
    pids)``."""
    slow = {**SMALL_EXPERIMENT, "seeds": list(seeds), "methods": {"dpsgd": {"C": 1.0}},
            "train": {**SMALL_EXPERIMENT["train"], "epochs": epochs}}
    params_path = make_workspace(tmp_path, repo_root, slow)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    proc = subprocess.Popen([sys.executable, "-c", _RUN, str(params_path), str(tmp_path)],
                            cwd=tmp_path, env=env)
    deadline = time.monotonic() + 300
    while not _training_started(tmp_path / "mlflow.db"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no training started (exit code {proc.wait()})")
        time.sleep(0.2)
    servers = _servers_of(proc.pid)
    assert servers  # the run's temporary server
    return params_path, proc, servers


def _signal(proc: subprocess.Popen[bytes], signum: int) -> int:
    os.kill(proc.pid, signum)
    return proc.wait(timeout=300)


def test_sigterm_during_the_finals_stops_them_and_starts_no_queued_one(tmp_path, repo_root,
                                                                       monkeypatch):
    """Three seeds of dpsgd and of the non-private reference: six trainings, two at a time
    (pipeline.max_workers), the rest queued. SIGTERM once one trains: none starts after the
    signal, the trainings in progress (2,000 epochs each) stop and end FAILED, nothing is left
    RUNNING or pending, and the process ends with 143."""
    from dpfair.ledger import SourceLedger

    monkeypatch.chdir(tmp_path)
    params_path, proc, servers = _run_until_training(tmp_path, repo_root, epochs=2000,
                                                     seeds=(0, 1, 2))
    signalled_ms = time.time() * 1000
    assert _signal(proc, signal.SIGTERM) == 128 + signal.SIGTERM
    assert not any(alive(server) for server in servers)
    client = MlflowClient(load_params(params_path).tracking.uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("dpfair-synthetic").experiment_id])
    finals = [r for r in runs if r.data.tags.get("dpfair.stage") == "final"]
    assert finals and len(finals) < 6  # queued trainings never started
    assert all(r.info.start_time <= signalled_ms for r in finals)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    assert {r.info.status for r in runs if r.data.tags.get("dpfair.stage") == "pipeline"
            } == {"FAILED"}
    assert {r.info.status for r in finals} == {"FAILED"}  # stopped at a step, not trained out
    assert not [r for r in SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases()
                if r.status == "pending"]


def test_kill_9_during_training_then_rerun(prefect_harness, tmp_path, repo_root, monkeypatch):
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    params_path, proc, orphans = _run_until_training(tmp_path, repo_root)
    _signal(proc, signal.SIGKILL)
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
