"""The Model Registry's conventions (dpfair/tracking/model_registry.py) on a real MLflow
SQLite store: every version is @challenger, @champion moves only when at least as good at no
more ε or by `dpfair promote`, versions link their logged model, and `predict --model NAME`
means @champion (the pipeline against a real server: tests/flows/test_mlflow_server.py)."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.errors import DataError
from dpfair.tracking.model_export import model_location
from dpfair.tracking.model_registry import (
    CHALLENGER,
    CHAMPION,
    EPSILON_TAG,
    MODEL_ID_TAG,
    at_least_as_good,
    champion,
    promote,
    register,
)
from dpfair.tracking.runs import TrackingConfig, client, experiment_id, run


def test_champion_rule_reads_numbers_and_refuses_missing_ones():
    old = {"worst_group_accuracy": "0.8", EPSILON_TAG: "2", "largest_group_gap": "0.1"}
    assert at_least_as_good({**old}, old)
    assert at_least_as_good({**old, "worst_group_accuracy": "0.9", EPSILON_TAG: "1.5"}, old)
    assert not at_least_as_good({**old, "worst_group_accuracy": "0.9", EPSILON_TAG: "2.1"}, old)
    assert not at_least_as_good({**old, "worst_group_accuracy": "0.79"}, old)
    assert not at_least_as_good({**old, "worst_group_accuracy": "nan"}, old)
    assert not at_least_as_good({"worst_group_accuracy": "0.9"}, old)  # no ε: never
    assert not at_least_as_good({**old, EPSILON_TAG: "inf"}, old)
    assert at_least_as_good({**old, "largest_group_gap": "0.05"}, old, "largest_group_gap")
    assert not at_least_as_good({**old, "largest_group_gap": "0.2"}, old, "largest_group_gap")


@pytest.fixture
def store(tmp_path):
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                         artifact_root=str(tmp_path / "art"))
    return cfg, experiment_id(cfg, "toy")


def _version(cfg: TrackingConfig, exp: str, worst: float, eps: float) -> dict[str, str]:
    """A logged model of a new run, registered with these test metrics and ε."""
    with run(cfg, exp, "train") as run_id:
        model = client(cfg).create_logged_model(exp, name="dpsgd", source_run_id=run_id)
    return register(cfg, "toy", f"models:/{model.model_id}", run_id,
                    {"worst_group_accuracy": f"{worst:g}", EPSILON_TAG: f"{eps:g}"},
                    f"version with worst {worst}")


def test_champion_moves_only_when_as_good_at_no_more_epsilon(store):
    cfg, exp = store
    mlf = MlflowClient(cfg.uri)
    assert _version(cfg, exp, 0.8, 2.0) == {"name": "toy", "version": "1", "champion": "1"}
    assert _version(cfg, exp, 0.9, 3.0)["champion"] == "1"  # fairer, but more ε
    assert _version(cfg, exp, 0.7, 1.0)["champion"] == "1"  # less ε, but less fair
    assert _version(cfg, exp, 0.0, math.inf)["champion"] == "1"  # the 0.0 default
    assert _version(cfg, exp, 0.8, 2.0)["champion"] == "5"  # as good at the same ε
    assert str(mlf.get_model_version_by_alias("toy", CHALLENGER).version) == "5"
    assert str(champion(cfg, "toy").version) == "5"
    # each version: its own description, linked to its logged model
    one = mlf.get_model_version("toy", "1")
    assert one.description == "version with worst 0.8"
    model = mlf.get_logged_model(one.tags[MODEL_ID_TAG])
    assert model.name == "dpsgd" and mlf.get_model_version_download_uri("toy", "1") == (
        model.artifact_location)
    assert json.loads(model.tags["mlflow.modelVersions"]) == [{"name": "toy", "version": "1"}]
    # an explicit promotion; the challenger by default
    assert promote(cfg, "toy", "2") == "2" and str(champion(cfg, "toy").version) == "2"
    assert promote(cfg, "toy") == "5"
    with pytest.raises(DataError, match="no version 9"):
        promote(cfg, "toy", "9")


def test_a_retried_registration_is_one_version(store):
    cfg, exp = store
    with run(cfg, exp, "train") as run_id:
        model = client(cfg).create_logged_model(exp, name="dpsgd", source_run_id=run_id)
    tags = {"worst_group_accuracy": "0.5", EPSILON_TAG: "1"}
    first = register(cfg, "toy", f"models:/{model.model_id}", run_id, tags)
    assert register(cfg, "toy", f"models:/{model.model_id}", run_id, tags) == first


def test_predict_and_promote_commands_use_the_champion(store, tmp_path, monkeypatch):
    cfg, exp = store
    for worst in (0.8, 0.5):
        _version(cfg, exp, worst, 1.0)
    mlf = MlflowClient(cfg.uri)
    champion_uri = mlf.get_model_version_download_uri("toy", "1")
    assert model_location(cfg, "toy") == model_location(cfg, "toy@champion") == champion_uri
    assert model_location(cfg, "toy@challenger") == mlf.get_model_version_download_uri("toy", "2")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"tracking": {"uri": cfg.uri, "artifact_root": cfg.artifact_root}}))
    out = CliRunner().invoke(app, ["promote", "toy", "2"])
    assert out.exit_code == 0 and "toy version 2 is now @champion" in out.output, out.output
    assert model_location(cfg, "toy") == mlf.get_model_version_download_uri("toy", "2")
    mlf.delete_registered_model_alias("toy", CHAMPION)
    with pytest.raises(DataError, match="has no @champion.*dpfair promote toy"):
        model_location(cfg, "toy")
