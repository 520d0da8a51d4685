"""Issue #16's and #27's end-to-end cases: a CSV the project has never seen (renamed columns, a
three-valued protected attribute, missing values) runs through the pipeline with params.yaml
edits only, gives the per-group table and registers a model that ``mlflow.pyfunc`` loads and
uses on raw rows, predicting what the training-time evaluation predicted."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import yaml

from dpfair.config.params import load_params
from dpfair.data import load_dataset
from dpfair.errors import PrivacyError
from dpfair.tracking.model_export import model_location
from dpfair.tracking.runs import metric_key
from tests.data.own_tables import TARGET, loans_frame, table_options
from tests.data.test_own_table import _matches
from tests.flows.conftest import SMALL_EXPERIMENT, make_workspace

EXPERIMENT = {**SMALL_EXPERIMENT, "dataset": "loans", "seeds": [0],
              "methods": {"dpsgd": {"C": 1.0}}, "nonprivate_reference": False,
              "train": {**SMALL_EXPERIMENT["train"], "epochs": 2, "batch_size": 64}}


@pytest.mark.slow
def test_own_csv_runs_registers_and_predicts_raw_rows(prefect_harness, tmp_path, repo_root,
                                                      monkeypatch):
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    frame = loans_frame(n=900)
    frame.to_csv(tmp_path / "loans.csv", index=False)
    params_path = make_workspace(tmp_path, repo_root, EXPERIMENT, pipeline={"use_dvc": False})
    raw = yaml.safe_load(params_path.read_text())
    raw["datasets"] = {"loans": table_options(tmp_path / "loans.csv")}
    params_path.write_text(yaml.safe_dump(raw, sort_keys=False))

    # the fitted transform would release exact training statistics: refused before training
    with pytest.raises(PrivacyError, match="budget.allow_fitted_preprocessing"):
        run_experiment(str(params_path), str(tmp_path))
    assert not (tmp_path / "mlartifacts").exists() or not any(
        (tmp_path / "mlartifacts").rglob("MLmodel"))

    raw["budget"]["allow_fitted_preprocessing"] = True
    params_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = run_experiment(str(params_path), str(tmp_path))
    params = load_params(params_path)
    dataset = load_dataset("loans", params.dataset("loans"))
    assert len(dataset.group_names) == 6 and "w × Ost" in dataset.group_names
    assert "dpsgd" in out["table"]
    # the terminal's table (issue 43): each of the six groups has a column or is named
    from typer.testing import CliRunner

    from dpfair.cli.commands import app

    shown = CliRunner().invoke(app, ["results", "--params", str(params_path)]).output
    header, legend = "\n".join(shown.splitlines()[1:3]), shown.split("left out here")[-1]
    assert all(g in header or g in legend for g in dataset.group_names), shown
    registered = out["registered_model"]
    assert registered is not None

    mlflow.set_tracking_uri(params.tracking.uri)
    try:
        model = mlflow.pyfunc.load_model(
            f"models:/{registered['name']}/{registered['version']}")
    finally:
        mlflow.set_tracking_uri(None)
    rows = pd.read_csv(tmp_path / "loans.csv").drop(columns=[TARGET])
    predicted = model.predict(rows)["prediction"].to_numpy()
    # the same rows through the dataset's own transform and the registered network
    client = mlflow.MlflowClient(params.tracking.uri)
    version = client.get_model_version(registered["name"], registered["version"])
    assert version.tags["method"] == "dpsgd"
    # the registry names the data version by the published id, never the file's md5
    assert version.tags["data_version"] == out["data_version"] != dataset.meta["data_version"]
    assert "fitted on the training split" in version.description  # prose: the description
    assert set(np.unique(predicted)) <= set(dataset.class_names)
    # the training-time evaluation: the raw rows of the test split, through the registered
    # model, reproduce the run's logged per-group test accuracy exactly
    test_rows = rows.iloc[_matches(dataset.test.x.numpy(),
                                   dataset.preprocessor.transform(rows))]
    right = model.predict(test_rows)["prediction"].to_numpy() == np.asarray(
        dataset.class_names)[dataset.test.y.numpy()]
    logged = client.get_run(version.run_id).data.metrics
    groups = dataset.test.g.numpy()
    for k, name in enumerate(dataset.group_names):
        if (groups == k).any():
            assert logged[metric_key(f"final/test/group_accuracy/{name}")] == pytest.approx(
                right[groups == k].mean(), abs=1e-9)


CENSUS_MODEL = """
import torch.nn as nn


def make_net(input_shape, n_classes, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], width), nn.Tanh(),
                         nn.Linear(width, n_classes))
"""


@pytest.mark.slow
def test_census_with_three_nationalities_and_integer_codes_end_to_end(
        prefect_harness, tmp_path, repo_root, monkeypatch):
    """Issue #27's done-when: an unseen table with a 3-valued protected attribute and
    integer-coded categories (declared as integers), an own-architecture model: every group in
    every output (table, results files, `dpfair results`, parent metrics, DVC metrics), registry
    tags that tell the protected attribute and groups, predictions typed like the target, and
    the registered model predicting from a fresh process in another directory."""
    from typer.testing import CliRunner

    from dpfair.cli.commands import app
    from dpfair.pipeline.dvc_outputs import write_outputs
    from flows.experiment import run_experiment
    from tests.data.own_tables import census_frame
    from tests.tracking.conftest import predict_elsewhere

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "census_models.py").write_text(CENSUS_MODEL)
    frame = census_frame(600)
    (tmp_path / "data" / "raw").mkdir(parents=True)
    frame.to_csv(tmp_path / "data" / "raw" / "census.csv", index=False)
    experiment = {**SMALL_EXPERIMENT, "dataset": "census", "seeds": [0],
                  "methods": {"dpsgd": {"C": 1.0}}, "nonprivate_reference": True,
                  "model": {"name": "import", "target": "census_models:make_net"},
                  "train": {**SMALL_EXPERIMENT["train"], "epochs": 1, "batch_size": 64}}
    params_path = make_workspace(tmp_path, repo_root, experiment, pipeline={"use_dvc": False})
    raw = yaml.safe_load(params_path.read_text())
    raw["datasets"] = {"census": {
        "kind": "table", "path": "data/raw/census.csv", "target": "Income",
        "protected": "Nationality", "id_columns": ["person"],
        "categories": {"Activity": [1, 2, 3], "Gender": ["F", "M"]},
        "numeric_ranges": {"Hours": [0, 100]}}}
    params_path.write_text(yaml.safe_dump(raw, sort_keys=False))

    out = run_experiment(str(params_path), str(tmp_path))
    groups = ["A", "B", "C"]
    results = pd.read_csv(Path(out["results_dir"]) / "results.csv", index_col=0)
    for g in groups:  # every group by name: accuracy and privacy cost
        assert f"acc_{g}" in results.columns and f"pi_{g}" in results.columns
        assert f"acc_{g}" in out["table"]
    assert {"acc_worst_group", "acc_gap_max", "pi_gap_max"} <= set(results.columns)
    shown = CliRunner().invoke(app, ["results", "--full", "--params", str(params_path)])
    assert shown.exit_code == 0 and all(f"acc_{g}" in shown.output for g in groups)
    # the terminal's table (issue 43): every group a column of its own, the gap none
    shown = CliRunner().invoke(app, ["results", "--params", str(params_path)])
    header = shown.output.splitlines()[1:3]
    assert shown.exit_code == 0 and "gap_max" not in shown.output, shown.output
    assert header[1].split()[1:4] == groups, shown.output  # after "method"
    metrics = json.loads(write_outputs(Path(out["results_dir"]) / "results.csv",
                                       tmp_path / "evaluation")["details.json"].read_text())
    assert set(metrics["group_accuracy"]["dpsgd"]) == set(groups)

    params = load_params(params_path)
    client = mlflow.MlflowClient(params.tracking.uri)
    parent = client.get_run(out["parent_run_id"]).data.metrics
    assert {f"group_accuracy/{g}/dpsgd" for g in groups} <= set(parent)
    registered = out["registered_model"]
    tags = client.get_model_version(registered["name"], registered["version"]).tags
    assert (tags["protected_attributes"], tags["group_names"], tags["target"]) == (
        '["Nationality"]', '["A", "B", "C"]', "Income")  # JSON lists
    assert tags["data_version"] == out["data_version"]  # the published data-version id

    # the registered model, from a fresh process in another directory, on raw rows
    location = model_location(params.tracking,
                              f"{registered['name']}/{registered['version']}")
    found = predict_elsewhere(location, tmp_path / "data" / "raw" / "census.csv",
                              tmp_path.parent / f"{tmp_path.name}-elsewhere", "census_models")
    assert len(found["predictions"]) == len(frame)
    assert set(found["predictions"]) <= {0, 1}  # typed like the target: integers
    assert "/code/" in found["module"]
