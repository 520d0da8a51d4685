"""`dpfair serve` against a real `prefect server start`: the scheduled deployment exists with
params.yaml's cron, and a triggered run of it completes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.flows.conftest import SMALL_EXPERIMENT, make_workspace, seed_home

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"prefect server at {url} not healthy after {timeout} s")


def test_serve_without_server_says_what_to_do(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    (tmp_path / "params.yaml").write_text("{}\n")
    done = subprocess.run([str(BIN / "dpfair"), "serve"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "prefect server start" in done.stderr and "PREFECT_API_URL" in done.stderr


def test_the_api_url_of_the_active_prefect_profile_counts(tmp_path):
    """`prefect config set PREFECT_API_URL=...` is enough: serve reads the active profile."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    api = "http://127.0.0.1:4999/api"
    subprocess.run([str(BIN / "prefect"), "config", "set", f"PREFECT_API_URL={api}"],
                   env=env, check=True, capture_output=True, timeout=120)
    done = subprocess.run([sys.executable, "-c", "from flows.server import api_url; "
                           "print(api_url())"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.strip() == api, done.stderr


@pytest.mark.slow
def test_scheduled_deployment_runs_on_a_real_server(tmp_path, repo_root):
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    home = seed_home(tmp_path / "prefect-home")
    env = {**os.environ, "PREFECT_HOME": str(home),
           "PREFECT_API_URL": api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_RUNNER_POLL_FREQUENCY": "1",  # the served runner's poll (Prefect's 10 s)
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    make_workspace(workspace, repo_root, {**SMALL_EXPERIMENT, "seeds": [0]},
                   pipeline={"schedule": {"name": "nightly", "cron": "0 4 * * *"}})
    logs = tmp_path / "logs"
    logs.mkdir()
    server = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=(logs / "server.log").open("w"), stderr=subprocess.STDOUT)
    served = None
    try:
        _wait_healthy(api, server, timeout=120)
        served = subprocess.Popen([str(BIN / "dpfair"), "serve"], cwd=workspace, env=env,
                                  stdout=(logs / "serve.log").open("w"),
                                  stderr=subprocess.STDOUT)
        trigger = """
import asyncio, json, time
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
name = "dpfair-retrain/nightly"
async def deployment():
    async with get_client() as client:
        for _ in range(600):
            try:
                return await client.read_deployment_by_name(name)
            except Exception:
                await asyncio.sleep(0.2)
        raise TimeoutError("deployment never registered")
dep = asyncio.run(deployment())
run = run_deployment(name, timeout=300, poll_interval=0.5)
print(json.dumps({"state": run.state.type.value,
                  "crons": [s.schedule.cron for s in dep.schedules],
                  "timezones": [s.schedule.timezone for s in dep.schedules]}))
"""
        done = subprocess.run([sys.executable, "-c", trigger], env=env, capture_output=True,
                              text=True, timeout=420)
        assert done.returncode == 0, done.stderr[-3000:] + (logs / "serve.log").read_text()[-3000:]
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome["crons"] == ["0 4 * * *"]
        assert outcome["timezones"] == ["UTC"]
        assert outcome["state"] == "COMPLETED", (logs / "serve.log").read_text()[-3000:]
        assert (workspace / "mlflow.db").exists()
    finally:
        for proc in (served, server):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
