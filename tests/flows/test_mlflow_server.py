"""The pipeline against a real MLflow tracking server with proxied artifacts (`mlflow server
--artifacts-destination`): models and figures land in the server's store, never on the
client's disk, and the registered @champion loads through the server alone."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.tracking.model_registry import CHALLENGER, CHAMPION, EPSILON_TAG, MODEL_ID_TAG
from dpfair.tracking.runs import TrackingConfig, ui_hint
from tests.flows.conftest import make_workspace

pytestmark = pytest.mark.slow

# The smallest pipeline on the default dataset: one private method, one seed, one epoch.
TINY_DIGITS = {
    "dataset": "digits",
    "model": {"name": "logistic_regression"},
    "train": {"epochs": 1, "batch_size": 128, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
              "progress": False},
    "methods": {"dpsgd": {"C": 1.0}},
    "seeds": [0],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on a free loopback port: SQLite backend (a copy of MLflow's empty
    store, as dpfair starts a new store: the server skips the migrations), proxied artifacts."""
    from dpfair.tracking.empty_store import seed

    root = tmp_path_factory.mktemp("mlflow-server")
    seed(str(root / "server.db"))
    port = _free_port()
    program = Path(sys.executable).parent / "mlflow"
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(
        [str(program), "server", "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT,
        # no job runner (its queue consumers are four more processes; nothing here submits jobs)
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not start in 120 s"
            time.sleep(0.5)
        yield url, root
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _page_text(url: str) -> str:
    """The text a fresh headless Chromium shows at ``url`` once MLflow's page has rendered."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1600,3000",
         "--virtual-time-budget=20000", "--dump-dom", url],
        capture_output=True, text=True, timeout=240).stdout
    text = re.sub(r"<style.*?</style>|<script.*?</script>", " ", dom, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", text).split())


def test_pipeline_on_a_server_keeps_artifacts_there_and_serves_the_champion(
        prefect_harness, mlflow_server, tmp_path, repo_root, monkeypatch):
    from flows.experiment import run_experiment

    url, server_root = mlflow_server
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params_path = make_workspace(tmp_path, repo_root, TINY_DIGITS,
                                 datasets={"digits": {"seed": 0}},
                                 tracking={"uri": url, "artifact_root": "client-artifacts"})
    out = run_experiment(str(params_path), str(tmp_path))
    name = "dpfair-digits"
    assert out["registered_model"] == {"name": name, "version": "1", "champion": "1"}

    # the server decides where artifacts go: nothing on the client's disk
    client = MlflowClient(url)
    assert client.get_experiment(out["experiment_id"]).artifact_location.startswith(
        "mlflow-artifacts:")
    assert not (tmp_path / "client-artifacts").exists()
    assert list((server_root / "artifacts").rglob("MLmodel"))
    assert list((server_root / "artifacts").rglob("group_accuracy.png"))
    assert ui_hint(TrackingConfig(uri=url)) == f"open the MLflow UI at {url}"

    # the registry's conventions: aliases, numbers in tags, prose in the description,
    # the logged model named by its method, with params and metrics
    version = client.get_model_version_by_alias(name, CHAMPION)
    assert str(version.version) == "1"
    assert str(client.get_model_version_by_alias(name, CHALLENGER).version) == "1"
    assert 0.0 <= float(version.tags["worst_group_accuracy"]) <= 1.0
    assert float(version.tags[EPSILON_TAG]) > 0 and "%" in version.description
    logged = client.get_logged_model(version.tags[MODEL_ID_TAG])
    assert logged.name == "dpsgd" and logged.params["method.C"] == "1.0"
    assert {m.key for m in logged.metrics} >= {"final/test/worst_group_accuracy", "epsilon"}
    assert client.get_model_version_download_uri(name, "1").startswith("mlflow-artifacts:")

    # @champion loads through the server alone, in Python and from the command line
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    model = mlflow.pyfunc.load_model(f"models:/{name}@{CHAMPION}")
    rows = pd.DataFrame(np.zeros((3, 64)), columns=[f"x{i}" for i in range(64)])
    assert len(model.predict(rows)) == 3
    rows.to_csv(tmp_path / "rows.csv", index=False)
    done = CliRunner().invoke(app, ["predict", "--model", name, "--input", "rows.csv",
                                    "--output", "preds.csv", "--params", str(params_path)])
    assert done.exit_code == 0, done.output
    assert len(pd.read_csv(tmp_path / "preds.csv")) == 3
    shown = CliRunner().invoke(app, ["results", "--params", str(params_path)])
    assert shown.exit_code == 0, shown.output
    assert f"pipeline run {out['parent_run_id']} of dataset digits" in shown.output
    assert max(len(line) for line in shown.output.splitlines()) <= 120
    assert "acc worst" in shown.output or "acc " in shown.output

    # issue 43, in a real browser: the printed link opens the pipeline run's own page, and
    # its per-method comparison runs compare side by side, one acc_<group> row per group
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("Chromium is not installed (.ci/run may install Debian's chromium)")
    parent = client.get_run(out["parent_run_id"])
    assert out["tracking_url"] == (f"{url}/#/experiments/{out['experiment_id']}/runs/"
                                   f"{out['parent_run_id']}")
    page = _page_text(out["tracking_url"])
    assert parent.info.run_name in page and "worst_group_accuracy/dpsgd" in page, page[:3000]
    # its "Model metrics" tab: one section of charts per group, a chart per method in each
    page = _page_text(f"{out['tracking_url']}/model-metrics")
    assert all(f"group_accuracy/{d} (2)" in page for d in range(10)), page[:3000]
    compared = client.search_runs([out["experiment_id"]],
                                  "tags.`dpfair.stage` = 'comparison'")
    assert {r.data.tags["dpfair.method"] for r in compared} == {"dpsgd", "nonprivate"}
    ids = urllib.parse.quote(json.dumps([r.info.run_id for r in compared]))
    experiments = urllib.parse.quote(json.dumps([out["experiment_id"]]))
    page = _page_text(f"{url}/#/compare-runs?runs={ids}&experiments={experiments}")
    assert "Comparing 2 Runs" in page and "dpsgd · mean over seeds" in page, page[:3000]
    assert all(f"acc_{d}" in page for d in range(10)), page[:3000]  # every group by name
