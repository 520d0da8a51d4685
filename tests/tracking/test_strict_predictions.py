"""Predictions held to training's rules (issue 27): integer-coded categories declared as
integers, an unseen category value refused with its column, value and row (or ignored when the
dataset says so), the target and protected columns accepted without a warning, id columns
carried into the output, predictions typed like the target; `dpfair predict` reads CSV or
Parquet and calls a bad file a user error."""

from __future__ import annotations

import logging

import pandas as pd
import pytest
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.data.tabular_frame import dataset_from_frame
from dpfair.errors import DataError
from dpfair.tracking.model_export import PREDICTION
from dpfair.tracking.model_load import load, predict_csv
from tests.conftest import cli_in_a_fresh_python
from tests.data.own_tables import CENSUS_OPTIONS as OPTIONS
from tests.data.own_tables import census_frame
from tests.tracking.conftest import train_and_log


def _logged(tmp_path, **options) -> tuple:
    frame = census_frame()
    dataset = dataset_from_frame(frame, name="census", **{**OPTIONS, **options})
    tracking, _, uri = train_and_log(tmp_path, dataset, {"name": "mlp", "hidden": [8]},
                                     "census")
    return frame, dataset, tracking, uri


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    return _logged(tmp_path_factory.mktemp("strict"))


def test_integer_categories_declared_as_integers_stay_categories(strict):
    _, dataset, _, _ = strict
    assert set(dataset.meta["columns"]["categorical"]) == {"Gender", "Activity"}
    assert "person" not in dataset.preprocessor.columns  # an id column is no feature
    assert dataset.group_names == ["A", "B", "C"]
    assert dataset.meta["class_values"] == [0, 1]


def test_an_undeclared_coded_integer_column_gets_one_warning():
    frame = census_frame()
    with pytest.warns(UserWarning, match=r"'Activity'.*3 distinct.*categorical.*\[Activity\]"):
        dataset_from_frame(frame, target="Income", protected="Nationality",
                           id_columns=["person"])


def test_raw_rows_with_their_other_columns_predict_typed_like_the_target(strict, caplog):
    frame, _, tracking, uri = strict
    model = load(tracking, uri)
    with caplog.at_level(logging.WARNING):
        out = model.predict(frame)  # the target, protected and id columns as they are
    assert not [r for r in caplog.records if "extra inputs" in r.getMessage()]
    assert list(out.columns[:2]) == ["person", PREDICTION]
    assert (out["person"] == frame["person"]).all()
    assert pd.api.types.is_integer_dtype(out[PREDICTION])
    assert (out[PREDICTION] == frame["Income"]).mean() > 0.5  # comparable with the target


@pytest.mark.parametrize("column, value", [("Activity", 999), ("Gender", "X")])
def test_an_unseen_category_is_refused_with_column_value_and_row(strict, column, value):
    frame, _, tracking, uri = strict
    rows = frame.head(5).copy()
    rows[column] = rows[column].astype(object)
    rows.loc[3, column] = value
    with pytest.raises(DataError, match=rf"column '{column}' holds '{value}' in row 3.*never "
                       "saw.*unknown: ignore"):
        load(tracking, uri).predict(rows)


def test_unknown_ignore_predicts_unseen_categories(tmp_path):
    frame, _, tracking, uri = _logged(tmp_path, unknown="ignore")
    rows = frame.head(5).copy()
    rows.loc[3, "Activity"] = 999
    assert len(load(tracking, uri).predict(rows)) == 5


def test_predict_reads_parquet_and_calls_a_bad_file_a_user_error(strict, tmp_path):
    frame, _, tracking, uri = strict
    frame.head(20).to_parquet(tmp_path / "rows.parquet")
    assert predict_csv(tracking, uri, tmp_path / "rows.parquet", tmp_path / "p.csv") == 20
    written = pd.read_csv(tmp_path / "p.csv")
    assert list(written["person"]) == list(frame["person"].head(20))
    (tmp_path / "rows.csv").write_bytes((tmp_path / "rows.parquet").read_bytes())
    params = tmp_path / "params.yaml"
    params.write_text(f"tracking: {{uri: '{tracking.uri}', artifact_root: "
                      f"'{tracking.artifact_root}'}}\n")
    result = CliRunner().invoke(app, ["predict", "--model", uri, "--input",
                                      str(tmp_path / "rows.csv"), "--output",
                                      str(tmp_path / "q.csv"), "--params", str(params)])
    assert result.exit_code == 2, result.output
    assert "cannot read" in result.output and "bug" not in result.output


def test_predict_refuses_wrong_rows_before_the_network_loads(strict, tmp_path):
    """`dpfair predict` refuses a file that is no table before it imports MLflow, and an
    unseen category by the model's saved rules (its MLmodel and JSON transform) before torch
    and the network load."""
    frame, _, tracking, uri = strict
    rows = frame.head(20).copy()
    rows.loc[5, "Activity"] = 999
    rows.to_csv(tmp_path / "unseen.csv", index=False)
    frame.head(5).to_parquet(tmp_path / "junk.csv")  # Parquet bytes under a CSV name
    (tmp_path / "params.yaml").write_text(f"tracking: {{uri: '{tracking.uri}', artifact_root: "
                                          f"'{tracking.artifact_root}'}}\n")
    command = ["predict", "--model", uri, "--output", "out.csv", "--params", "params.yaml"]
    found, loaded = cli_in_a_fresh_python(
        tmp_path, {"junk": [*command, "--input", "junk.csv"]}, ("mlflow", "torch"))
    assert loaded == [] and found["junk"][0] == 2 and "cannot read" in found["junk"][1]
    found, loaded = cli_in_a_fresh_python(
        tmp_path, {"unseen": [*command, "--input", "unseen.csv"]}, ("mlflow", "torch"))
    code, output = found["unseen"]
    assert loaded == ["mlflow"], loaded  # the model's files come from its tracking store
    assert code == 2 and "column 'Activity' holds '999' in row 5" in output, output
    assert not (tmp_path / "out.csv").exists()
