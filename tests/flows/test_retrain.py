"""Scheduled retraining (flows/schedule.py) under a local Prefect test harness: an unchanged
data version skips, a changed one runs the pipeline, registers a new model version and records
its release in the privacy ledger, a retrain past the lifetime budget is refused before
training; each flow run names its MLflow run (tag and results artifact) and the MLflow run
names the flow run."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
import yaml
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from dpfair.config.params import load_params
from dpfair.data import source_version
from dpfair.errors import BudgetExceededError
from dpfair.ledger import SourceLedger
from dpfair.ledger.people import version_id
from tests.conftest import epsilon_oracle
from tests.flows.conftest import SMALL_EXPERIMENT, fail_training_of, make_workspace

TINY = {**SMALL_EXPERIMENT, "seeds": [0], "methods": {"dpsgd": {"C": 1.0}},
        "nonprivate_reference": False,
        "train": {**SMALL_EXPERIMENT["train"], "epochs": 2}}


def _pipeline_runs(params_path: Path) -> list:
    params = load_params(params_path)
    client = MlflowClient(params.tracking.uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, "tags.`dpfair.stage` = 'pipeline'")


def _set(params_path: Path, section: str, key: str, value: object) -> None:
    data = yaml.safe_load(params_path.read_text())
    node = data
    for part in section.split("."):
        node = node.setdefault(part, {})
    node[key] = value
    params_path.write_text(yaml.safe_dump(data, sort_keys=False))


def _artifacts(flow_run_id: str) -> list:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)])))


@pytest.mark.slow
def test_retrain_skips_unchanged_data_and_composes_changed_data(prefect_harness, tmp_path,
                                                                repo_root, monkeypatch):
    from flows.schedule import retrain_flow

    monkeypatch.chdir(tmp_path)
    params_path = make_workspace(tmp_path, repo_root, TINY, pipeline={"use_dvc": False})
    ledger = SourceLedger(".dpfair/ledger.sqlite", tmp_path)
    first = retrain_flow(params_path="params.yaml", root=str(tmp_path))
    version = source_version("synthetic", load_params(params_path).dataset("synthetic"))
    public = version_id(ledger.secret(), version)  # the only published id: never the md5
    assert not first["skipped"] and first["data_version"] == public
    [parent] = _pipeline_runs(params_path)
    assert parent.info.run_id == first["parent_run_id"]
    [release] = ledger.releases("synthetic")
    assert (release.status, release.version) == ("released", version)
    assert release.context["mlflow_run_id"] == parent.info.run_id
    assert parent.data.tags["dpfair.ledger_release"] == release.id

    # the two sides name each other, and the flow run shows where the results are
    flow_run_id = parent.data.tags["dpfair.prefect_flow_run_id"]
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(UUID(flow_run_id))
    assert f"mlflow-run:{parent.info.run_id}" in flow_run.tags
    [artifact] = _artifacts(flow_run_id)
    assert artifact.key == "dpfair-results-synthetic" and artifact.type == "markdown"
    assert flow_run.name.startswith("synthetic · ")
    assert f"`{parent.info.run_id}`" in artifact.data
    assert f"#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}" in artifact.data
    assert first["table"] in artifact.data and f"version `{public}`" in artifact.data
    assert version not in artifact.data and parent.data.tags["dpfair.data_version"] == public
    registered = first["registered_model"]
    assert registered["version"] == "1"
    assert f"`{registered['name']}` version 1" in artifact.data

    # unchanged data: skipped, nothing trained, nothing spent
    again = retrain_flow(params_path="params.yaml", root=str(tmp_path))
    assert again == {"skipped": True, "data_version": public}
    assert len(_pipeline_runs(params_path)) == 1 and len(ledger.releases()) == 1

    # new data (same people by default): retrained, and its release composes with the first
    _set(params_path, "datasets", "synthetic", {"n": 900, "n_features": 6,
                                                "minority_fraction": 0.2})
    changed = retrain_flow(params_path="params.yaml", root=str(tmp_path))
    assert not changed["skipped"] and changed["previous_version"] == public
    assert changed["data_version"] != public
    assert changed["registered_model"]["version"] == "2"
    model_version = MlflowClient(load_params(params_path).tracking.uri).get_model_version(
        registered["name"], "2")
    assert model_version.run_id in {r["run_id"] for r in changed["runs"]}
    assert len(_pipeline_runs(params_path)) == 2
    first_release, second = ledger.releases("synthetic")
    assert second.accounts == first_release.accounts and second.status == "released"
    spent = ledger.spent("synthetic", second.version, second.delta)
    assert spent == pytest.approx(epsilon_oracle(
        first_release.dp_event(), second.dp_event(), delta=second.delta), rel=1e-4)
    [artifact] = _artifacts(_pipeline_runs(params_path)[0].data.tags[
        "dpfair.prefect_flow_run_id"])
    assert f"so far ε {spent:.2f}" in artifact.data

    # a third version would pass the run's budget but not the lifetime one: refused
    # before anything trains, and nothing is recorded
    _set(params_path, "budget", "lifetime_epsilon", round(spent * 1.01, 4))
    _set(params_path, "datasets", "synthetic", {"n": 1000, "n_features": 6,
                                                "minority_fraction": 0.2})
    with pytest.raises(BudgetExceededError, match="spent so far on these people") as err:
        retrain_flow(params_path="params.yaml", root=str(tmp_path))
    assert f"ε {spent:.3g} in 2 release(s)" in str(err.value)
    assert len(_pipeline_runs(params_path)) == 2 and len(ledger.releases()) == 2


def test_deployment_parameters_are_relative(tmp_path, repo_root, monkeypatch):
    from flows.schedule import deployment

    monkeypatch.chdir(tmp_path)
    make_workspace(tmp_path, repo_root, TINY,
                   pipeline={"schedule": {"name": "nightly", "cron": "0 4 * * *"}})
    served = deployment()
    assert served.parameters == {"params_path": "params.yaml", "root": "."}
    assert served.name == "nightly" and served.flow_name == "dpfair-retrain"
    assert str(tmp_path) not in repr(served.parameters)


@pytest.mark.slow
def test_a_failed_retrain_is_charged_and_retried_on_the_next_trigger(prefect_harness, tmp_path,
                                                                     repo_root, monkeypatch):
    """A retrain that fails after its trainings started may have released something: it is
    charged, but it completes nothing, so the next trigger retries it (charged again) instead
    of skipping the version as unchanged."""
    from dpfair.pipeline import method_steps
    from flows.schedule import retrain_flow

    monkeypatch.chdir(tmp_path)
    make_workspace(tmp_path, repo_root, TINY, pipeline={"use_dvc": False})
    real_train = method_steps.train
    fail_training_of(monkeypatch, "dpsgd")
    with pytest.raises(Exception, match="boom in the middle of training"):
        retrain_flow(params_path="params.yaml", root=str(tmp_path))
    ledger = SourceLedger(".dpfair/ledger.sqlite", tmp_path)
    [failed] = ledger.releases("synthetic")
    assert failed.status == "failed" and failed.epsilon > 0
    assert ledger.latest_version("synthetic") is None
    monkeypatch.setattr(method_steps, "train", real_train)
    retried = retrain_flow(params_path="params.yaml", root=str(tmp_path))
    assert not retried["skipped"] and retried["registered_model"] is not None
    first, second = ledger.releases("synthetic")
    assert (first.status, second.status) == ("failed", "released")
    assert second.accounts == first.accounts and second.epsilon > 0
    assert ledger.spent("synthetic", second.version, second.delta) > first.epsilon
    # now the version is complete: the next trigger skips it
    assert retrain_flow(params_path="params.yaml", root=str(tmp_path))["skipped"]
