"""``pipeline.task_runner: dask``: a small pipeline's trainings run on a local Dask cluster
(worker processes, as on a remote scheduler's machines) and log into the same MLflow parent."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("prefect_dask", reason="prefect-dask is not installed (pyproject.toml)")
pytest.importorskip("distributed", reason="dask.distributed is not installed (pyproject.toml)")

from mlflow import MlflowClient  # noqa: E402

from dpfair.config import load_params  # noqa: E402
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
