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


def test_trainings_run_on_a_local_dask_cluster_sharing_one_temporary_server(tmp_path,
                                                                             repo_root):
    """Without a Prefect server, the flow and its Dask worker processes use one temporary API
    server (not one each); the trainings run in a worker process, not the flow's, and log
    under the flow's MLflow parent; the run ends without a traceback. (One test: each Dask
    worker imports torch, which is most of its time.)"""
    import subprocess
    import sys

    experiment = {**SMALL_EXPERIMENT, "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0, 1],
                  "nonprivate_reference": False,
                  "train": {**SMALL_EXPERIMENT["train"], "epochs": 1}}
    params_path = make_workspace(tmp_path, repo_root, experiment,
                                 pipeline={"task_runner": "dask", "max_workers": 1,
                                           "use_dvc": False})
    code = ("from flows.experiment import run_experiment\n"
            f"out = run_experiment({str(params_path)!r}, {str(tmp_path)!r})\n"
            "print('done', out['experiment_id'], out['parent_run_id'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": str(repo_root)})
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "done " in done.stdout, output[-3000:]
    assert output.count("temporary server on http") == 1, output[-3000:]  # one started
    assert "Traceback" not in output, output[-3000:]
    exp_id, parent_id = done.stdout.split("done ")[-1].split()
    client = MlflowClient(load_params(params_path).tracking.uri)
    finals = client.search_runs([exp_id], "tags.`dpfair.stage` = 'final'")
    assert sorted(int(r.data.tags["dpfair.seed"]) for r in finals) == [0, 1]
    assert all(r.data.tags["mlflow.parentRunId"] == parent_id for r in finals)
    assert all(r.info.status == "FINISHED" for r in finals)
    flow_pid = client.get_run(parent_id).data.tags["dpfair.pid"]
    assert flow_pid not in {r.data.tags["dpfair.pid"] for r in finals}  # in Dask's worker
