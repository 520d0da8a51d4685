"""A final model as an MLflow pyfunc Model: it applies the dataset's preprocessing to raw rows
and predicts as the training-time evaluation did; `dpfair predict` does the same from a CSV;
which final model a pipeline run registers (the registry itself: test_registry.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.data import load_dataset
from dpfair.data.dataset import Split
from dpfair.data.preprocess import TablePreprocessor
from dpfair.pipeline.method_steps import RunRecord
from dpfair.tracking.model_export import PREDICTION, PROBABILITY, log_model, model_location
from dpfair.tracking.model_load import load, predict_csv
from dpfair.tracking.model_registry import register
from dpfair.tracking.runs import TrackingConfig, experiment_id, run
from dpfair.training import TrainConfig, train

COLUMNS = [f"feature {name}" for name in "abcdefghij"]


def _raw(split: Split) -> pd.DataFrame:
    """Raw rows behind a split's features (another scale and offset per column)."""
    x = split.x.numpy().astype(np.float64)
    return pd.DataFrame(x * np.arange(1, 11) * 7.0 + 40.0, columns=COLUMNS)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A model trained on features a table transform made from raw rows (numbers only,
    standardised), logged to MLflow."""
    tmp = tmp_path_factory.mktemp("export")
    base = load_dataset("synthetic", {"n": 400})
    pre = TablePreprocessor(COLUMNS, [], impute=False).fit(_raw(base.train))
    splits = {name: Split(torch.from_numpy(pre.transform(_raw(split))), split.y, split.g)
              for name, split in base.splits().items()}
    dataset = replace(base, **splits, preprocessor=pre)
    config = TrainConfig(method={"name": "dpsgd", "C": 1.0}, model={"name": "mlp", "hidden": [8]},
                         epochs=2, batch_size=50, lr=0.5, sigma=1.0, progress=False,
                         device="cpu")
    result = train(config, dataset)
    tracking = TrackingConfig(uri=f"sqlite:///{tmp / 'mlflow.db'}",
                              artifact_root=str(tmp / "art"))
    exp = experiment_id(tracking, "synthetic")
    with run(tracking, exp, "train") as run_id:
        uri = log_model(tracking, exp, run_id, result, dataset, {"method": "dpsgd"})
    return {"tmp": tmp, "tracking": tracking, "run_id": run_id, "uri": uri,
            "dataset": dataset, "base": base, "result": result}


def test_pyfunc_applies_the_preprocessing_to_raw_rows(logged):
    dataset, result = logged["dataset"], logged["result"]
    model = load(logged["tracking"], logged["uri"])
    assert model.metadata.get_input_schema().input_names() == COLUMNS
    raw = _raw(logged["base"].test)
    assert not np.allclose(raw.to_numpy(), dataset.test.x.numpy())  # the transform matters
    out = model.predict(raw)
    expected = np.asarray(dataset.class_names)[result.test_predictions.y_pred]
    np.testing.assert_array_equal(out[PREDICTION].to_numpy(), expected)
    probs = out[[f"{PROBABILITY}{c}" for c in dataset.class_names]].to_numpy()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    # whole numbers (int64, as pandas reads them from a CSV) are accepted as raw rows
    assert len(model.predict(raw.round().astype("int64"))) == len(raw)


def test_models_logged_before_the_move_into_packages_find_their_class():
    """A model keeps its class pickled by name; those logged before dpfair's modules moved
    into packages name it ``dpfair.model_export.DpfairModel``."""
    import pickle

    from dpfair.tracking import model_export

    old = pickle.dumps(model_export.DpfairModel, protocol=0).replace(
        b"dpfair.tracking.model_export", b"dpfair.model_export")
    assert b"dpfair.model_export" in old
    assert pickle.loads(old) is model_export.DpfairModel


def test_input_example_is_no_training_row(logged):
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=model_location(logged["tracking"], logged["uri"]),
        dst_path=str(logged["tmp"] / "m"))
    example = mlflow.models.Model.load(local).load_input_example(local)
    assert list(example.columns) == COLUMNS and not example.to_numpy().any()
    assert (Path(local) / "artifacts" / "preprocessor.json").is_file()
    tags = mlflow.MlflowClient(logged["tracking"].uri).get_logged_model(
        logged["uri"].removeprefix("models:/")).tags
    assert tags["preprocessing"] == "fitted"  # a token; the words are in the descriptions


def test_predict_command_reads_a_csv_and_writes_predictions(logged, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tracking = logged["tracking"]
    registered = register(tracking, "toy", logged["uri"], logged["run_id"], {"method": "dpsgd"})
    again = register(tracking, "toy", logged["uri"], logged["run_id"], {})
    assert registered == again == {"name": "toy", "version": "1", "champion": "1"}  # once
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"tracking": {"uri": tracking.uri, "artifact_root": tracking.artifact_root}}))
    raw = _raw(logged["base"].test)
    raw.round().astype("int64").to_csv(tmp_path / "rows.csv", index=False)
    out = CliRunner().invoke(app, ["predict", "--model", "toy", "--input", "rows.csv",
                                   "--output", "preds.csv"])
    assert out.exit_code == 0, out.output
    written = pd.read_csv(tmp_path / "preds.csv")
    direct = load(tracking, "models:/toy/1").predict(raw.round())
    assert list(written[PREDICTION].astype(str)) == list(direct[PREDICTION])
    # a missing column, an unknown model: one clear message each, nothing written
    raw.drop(columns=[COLUMNS[3]]).to_csv(tmp_path / "short.csv", index=False)
    out = CliRunner().invoke(app, ["predict", "--model", "toy/1", "--input", "short.csv",
                                   "--output", "short_preds.csv"])
    assert out.exit_code == 2 and "feature d" in out.output, out.output
    out = CliRunner().invoke(app, ["predict", "--model", "absent", "--input", "rows.csv",
                                   "--output", "x.csv"])
    assert out.exit_code == 2 and "no registered model 'absent'" in out.output, out.output
    assert not (tmp_path / "short_preds.csv").exists() and not (tmp_path / "x.csv").exists()


def test_rows_left_missing_after_preprocessing_are_refused(logged, tmp_path):
    from dpfair.errors import DataError

    rows = _raw(logged["base"].test).head(3)
    rows.loc[1, COLUMNS[0]] = np.nan  # this preprocessor does not impute
    rows.to_csv(tmp_path / "rows.csv", index=False)
    with pytest.raises(DataError, match=rf"column '{COLUMNS[0]}' has no value in row\(s\) 1"):
        predict_csv(logged["tracking"], logged["uri"], tmp_path / "rows.csv",
                    tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()


# ---------------------------------------------------------------- which model is registered


def _record(label: str, seed: int, worst: float) -> RunRecord:
    return RunRecord(label=label, seed=seed, run_id=f"{label}-{seed}", records=[], history={},
                     clip_trajectory={}, epsilon=1.0, privacy_guarantee="proven",
                     tuning_privacy="not tuned", model_uri=f"models:/{label}-{seed}",
                     headline={"worst_group_accuracy": worst, "largest_group_gap": 0.1,
                               "accuracy": 0.9, "macro_accuracy": 0.9})


def test_selection_uses_released_test_metrics_of_proven_private_methods_only():
    from types import SimpleNamespace

    from dpfair.pipeline.summary import select_model

    def release(guarantee: str = "proven", reproducible: bool = False, eps: float = 2.0):
        return SimpleNamespace(has_epsilon=guarantee == "proven", reproducible=reproducible,
                               epsilon=eps)

    plan = SimpleNamespace(methods={
        "dpsgd": release(), "dpsgd_f": release(), "fairlens": release("heuristic"),
        "nonprivate": release("none", eps=math.inf), "replayed": release(reproducible=True)})
    runs = [_record("dpsgd", 0, 0.70), _record("dpsgd", 1, 0.80),      # mean 0.75
            _record("dpsgd_f", 0, 0.78), _record("dpsgd_f", 1, 0.74),  # mean 0.76: best
            _record("fairlens", 0, 0.95), _record("nonprivate", 0, 0.99),
            _record("replayed", 0, 0.97)]
    chosen, rule = select_model(runs, plan)
    assert (chosen.label, chosen.seed) == ("dpsgd_f", 0) and "worst-group" in rule
    chosen, rule = select_model(runs, plan, "fairlens")  # asked for: its tags will say so
    assert chosen.label == "fairlens" and "pipeline.registry.method" in rule
    chosen, rule = select_model([r for r in runs if r.label == "fairlens"], plan)
    assert chosen is None and "proven guarantee" in rule


def test_a_table_read_from_a_file_predicts_from_its_raw_rows(logged):
    """A table dataset's own preprocessor (one-hot categories, imputation, standardisation):
    raw rows as pandas reads them (strings, whole numbers, gaps) give the evaluation's
    predictions; categorical columns are strings in the input example."""
    from dpfair.data.tabular_frame import dataset_from_frame
    from tests.data.own_tables import PROTECTED, TARGET, loans_frame

    frame = loans_frame(600)
    dataset = dataset_from_frame(frame, target=TARGET, protected=PROTECTED, name="loans",
                                 positive_label="ja", missing="impute", test_fraction=0.5)
    config = TrainConfig(method={"name": "dpsgd", "C": 1.0}, model={"name": "mlp", "hidden": [8]},
                         epochs=1, batch_size=50, lr=0.5, sigma=1.0, progress=False,
                         device="cpu")
    result = train(config, dataset)
    tracking = logged["tracking"]
    exp = experiment_id(tracking, "loans")
    with run(tracking, exp, "train") as run_id:
        uri = log_model(tracking, exp, run_id, result, dataset, {})
    model = load(tracking, uri)
    columns = dataset.preprocessor.columns
    assert set(columns) == set(frame.columns) - {TARGET, *PROTECTED}
    # every raw row through the model equals the network on the prepared features
    predicted = model.predict(frame[columns])[PREDICTION].to_numpy()
    with torch.no_grad():
        net = result.load_model().eval()
        ids = net(torch.from_numpy(dataset.preprocessor.transform(frame))).argmax(1).numpy()
    np.testing.assert_array_equal(predicted, np.asarray(dataset.class_names)[ids])
    local = mlflow.artifacts.download_artifacts(artifact_uri=model_location(tracking, uri),
                                                dst_path=str(logged["tmp"] / "loans"))
    example = mlflow.models.Model.load(local).load_input_example(local)
    assert (example["Beruf"] == "example").all() and (example["Alter"] == 0).all()


class _Planted:
    """A pickle that, when loaded, writes the file ``marker`` (what an attacker's would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_a_planted_preprocessor_pickle_in_a_model_is_never_loaded(logged, tmp_path):
    """The model's transform is JSON; a model folder whose preprocessor artifact is a pickle
    (an older dpfair's, or a planted one) is refused and the pickle never runs."""
    import pickle

    local = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=model_location(logged["tracking"], logged["uri"]),
        dst_path=str(tmp_path / "m")))
    marker = tmp_path / "ran.txt"
    (local / "artifacts" / "preprocessor.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    mlmodel = local / "MLmodel"
    mlmodel.write_text(mlmodel.read_text().replace("artifacts/preprocessor.json",
                                                   "artifacts/preprocessor.pkl"))
    with pytest.raises(Exception, match="preprocessor is a pickle"):
        load(logged["tracking"], str(local))
    (local / "artifacts" / "preprocessor.json").write_bytes(pickle.dumps(_Planted(marker)))
    mlmodel.write_text(mlmodel.read_text().replace("artifacts/preprocessor.pkl",
                                                   "artifacts/preprocessor.json"))
    with pytest.raises(Exception, match="not a dpfair table transform"):
        load(logged["tracking"], str(local))
    assert not marker.exists()


def test_a_planted_python_model_pickle_is_never_unpickled(logged, tmp_path, monkeypatch):
    """A model folder whose python_model.pkl is an attacker's pickle: `dpfair predict`
    rebuilds dpfair's model from dpfair_model.json and its weights (weights_only) and never
    unpickles it. A folder that only the pickle can load (no dpfair_model.json) is refused,
    naming --trust-model; given it, MLflow unpickles the folder, and the planted code runs
    (what the refusal protects against, and proof that the planted pickle is live)."""
    import pickle

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"tracking": {
        "uri": logged["tracking"].uri, "artifact_root": logged["tracking"].artifact_root}}))
    local = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=model_location(logged["tracking"], logged["uri"]),
        dst_path=str(tmp_path / "m")))
    marker = tmp_path / "ran.txt"
    (local / "python_model.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    _raw(logged["base"].test).to_csv(tmp_path / "rows.csv", index=False)

    def predict(*extra: str) -> tuple[int, str]:
        out = CliRunner().invoke(app, ["predict", "--model", str(local), "--input", "rows.csv",
                                       "--output", "preds.csv", *extra])
        return out.exit_code, " ".join(out.output.split())

    code, output = predict()
    assert code == 0, output
    expected = np.asarray(logged["dataset"].class_names)[logged["result"].test_predictions.y_pred]
    np.testing.assert_array_equal(pd.read_csv("preds.csv")[PREDICTION].astype(str), expected)
    assert not marker.exists()
    (local / "artifacts" / "dpfair_model.json").unlink()
    mlmodel = local / "MLmodel"
    spec = yaml.safe_load(mlmodel.read_text())
    del spec["flavors"]["python_function"]["artifacts"]["dpfair_model"]
    mlmodel.write_text(yaml.safe_dump(spec))
    Path("preds.csv").unlink()
    code, output = predict()
    assert code == 2 and "give --trust-model" in output and "python_model.pkl" in output, output
    assert not marker.exists() and not Path("preds.csv").exists()
    predict("--trust-model")  # the pickle is unpickled: the planted code runs
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("uri", ["s3://bucket/model", "http://example.org/model",
                                 "https://u:pw@example.org/m"])
def test_predict_loads_no_model_from_outside_the_store_or_a_named_folder(logged, uri):
    with pytest.raises(Exception, match=r"loads models only from the configured tracking store"
                                        ) as err:
        model_location(logged["tracking"], uri)
    assert "pw" not in str(err.value)


def test_a_header_only_input_is_a_clear_error(logged, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(Exception, match=r"holds no data rows; give a file with a header and rows"):
        predict_csv(logged["tracking"], logged["uri"], rows, tmp_path / "out.csv")


@pytest.mark.parametrize("state", [b"not a torch file", "tensor", "other keys"])
def test_a_model_state_that_is_not_the_networks_weights_is_a_clear_error(logged, tmp_path,
                                                                         state):
    """A damaged or replaced model_state.pt is a DataError naming the file and the fix, never
    "a bug in dpfair"."""
    from dpfair.errors import DataError

    local = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=model_location(logged["tracking"], logged["uri"]),
        dst_path=str(tmp_path / "m")))
    target = local / "artifacts" / "model_state.pt"
    if state == "tensor":
        torch.save(torch.zeros(3), target)
    elif state == "other keys":
        torch.save({"weight": torch.zeros(2, 2)}, target)
    else:
        target.write_bytes(state)
    with pytest.raises(DataError, match="model_state.pt: not the weights of this model's "
                                        "network"):
        load(logged["tracking"], str(local))
