"""``pipeline.task_runner: dask``: a small pipeline's trainings run on a local Dask cluster
(worker processes, as on a remote scheduler's machines) and log into the same MLflow parent."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("prefect_dask", reason="prefect-dask is not installed (pyproject.toml)")
pytest.importorskip("distributed", reason="dask.distributed is not installed (pyproject.toml)")

from mlflow import MlflowClient  # noqa: E402

from dpfair.config.params import load_params  # noqa: E402
from tests.flows.conftest import SMALL_EXPERIMENT, make_workspace  # noqa: E402

pytestmark = pytest.mark.slow


def test_trainings_run_on_a_local_dask_cluster(prefect_harness, tmp_path, repo_root,
                                               monkeypatch):
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    experiment = {**SMALL_EXPERIMENT, "methods": {"dpsgd": {"C": 1.0}},
                  "nonprivate_reference": False,
                  "train": {**SMALL_EXPERIMENT["train"], "epochs": 1}}
    params_path = make_workspace(tmp_path, repo_root, experiment,
                                 pipeline={"task_runner": "dask", "max_workers": 1,
                                           "use_dvc": False})
    out = run_experiment(str(params_path), str(tmp_path))
    client = MlflowClient(load_params(params_path).tracking.uri)
    finals = client.search_runs([out["experiment_id"]], "tags.`dpfair.stage` = 'final'")
    assert sorted(int(r.data.tags["dpfair.seed"]) for r in finals) == [0, 1]
    assert all(r.data.tags["mlflow.parentRunId"] == out["parent_run_id"] for r in finals)
    assert all(r.info.status == "FINISHED" for r in finals)
    # the trainings ran in Dask's worker process (one: each worker imports torch, which is
    # most of this test's time), not in the flow's
    pids = {r.data.tags["dpfair.pid"] for r in finals}
    assert str(os.getpid()) not in pids
    parent = client.get_run(out["parent_run_id"])
    assert parent.data.tags["dpfair.pid"] == str(os.getpid())
    assert "dpsgd" in out["table"]


def test_a_local_dask_cluster_shares_one_temporary_server_and_exits_cleanly(tmp_path, repo_root):
    """Without a Prefect server, the flow and its Dask worker processes use one temporary API
    server (not one each), and the run ends without a traceback."""
    import subprocess
    import sys

    experiment = {**SMALL_EXPERIMENT, "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0],
                  "nonprivate_reference": False,
                  "train": {**SMALL_EXPERIMENT["train"], "epochs": 1}}
    params_path = make_workspace(tmp_path, repo_root, experiment,
                                 pipeline={"task_runner": "dask", "max_workers": 1,
                                           "use_dvc": False})
    code = ("from flows.experiment import run_experiment\n"
            f"out = run_experiment({str(params_path)!r}, {str(tmp_path)!r})\n"
            "print('done', out['parent_run_id'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": str(repo_root)})
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "done " in done.stdout, output[-3000:]
    assert output.count("Starting temporary server") == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
