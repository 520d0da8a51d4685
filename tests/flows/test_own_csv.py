"""Issue #16's end-to-end case: a CSV the project has never seen (renamed columns, a
three-valued protected attribute, missing values) runs through the pipeline with params.yaml
edits only, gives the per-group table and registers a model that ``mlflow.pyfunc`` loads and
uses on raw rows, predicting what the training-time evaluation predicted."""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
import pytest
import yaml

from dpfair.config import load_params
from dpfair.data import load_dataset
from dpfair.errors import PrivacyError
from dpfair.tracking import metric_key
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
    assert "fitted on the training split" in version.tags.get("preprocessing", "")
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
