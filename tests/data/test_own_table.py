"""A CSV or Parquet file the project has never seen, declared in params.yaml (kind: table)."""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.config.params import Params, load_params
from dpfair.data import load_dataset, load_prepared, source_version
from dpfair.data.options import DatasetOptions
from dpfair.data.registry import _REGISTRY, DatasetSpec
from dpfair.data.tabular_frame import dataset_from_frame

from .own_tables import PROTECTED, TARGET, loans_frame, table_options, write_params

GROUPS = [f"{s} × {o}" for s in ("m", "w") for o in ("Nord", "Ost", "Sued")]


@pytest.fixture
def csv(tmp_path: Path) -> Path:
    path = tmp_path / "loans.csv"
    loans_frame().to_csv(path, index=False)
    return path


def _matches(x: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """For each row of x, the index of the candidate row equal to it (-1 if none)."""
    out = np.full(len(x), -1)
    for i, row in enumerate(x):
        hit = np.flatnonzero(np.all(candidates == row, axis=1))
        out[i] = hit[0] if len(hit) else -1
    return out


def test_csv_declared_in_params_loads_with_intersectional_groups(csv: Path, tmp_path: Path):
    params = load_params(write_params(tmp_path / "params.yaml",
                                      {"loans": table_options(csv)}, "loans"))
    assert params.declared_datasets() == ["loans"]
    ds = load_dataset(params.experiment.dataset, params.dataset("loans"))
    assert ds.name == "loans"
    assert ds.group_names == GROUPS
    assert ds.class_names == ["nein", "ja"]
    assert len(ds.train) + len(ds.val) + len(ds.test) == 900  # impute keeps every row
    assert len(ds.test) == 180 and len(ds.val) == 72
    # every group and class is in every split (stratified)
    for split in ds.splits().values():
        assert set(split.g.tolist()) == set(range(6))
        assert set(split.y.tolist()) == {0, 1}
    # the data version is the md5 of the file's bytes, as DVC records it
    assert ds.meta["data_version"] == hashlib.md5(csv.read_bytes()).hexdigest()
    assert source_version("loans", params.dataset("loans")) == ds.meta["data_version"]
    pre = ds.preprocessor
    assert pre.columns == ["Alter", "Einkommen", "Beruf"]
    assert ds.meta["feature_names"][:2] == ["Alter", "Einkommen"]
    assert ds.input_shape == (2 + 4,)  # two numbers, four jobs one-hot


def test_preprocessor_is_fit_on_training_rows_and_reproduces_every_split(csv: Path):
    ds = load_dataset("loans", table_options(csv))
    train = ds.train.x.numpy()
    # standardised with the training split's statistics: exactly mean 0 / std 1 there only
    np.testing.assert_allclose(train[:, :2].mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train[:, :2].std(0), 1.0, atol=1e-4)
    assert np.abs(ds.test.x.numpy()[:, :2].mean(0)).max() > 1e-3
    # the raw rows of the file, transformed, are exactly the split rows (after a pickle trip)
    pre = pickle.loads(pickle.dumps(ds.preprocessor))
    raw = pd.read_csv(csv)
    all_rows = pre.transform(raw)
    assert all_rows.dtype == np.float32
    for split in ds.splits().values():
        hits = _matches(split.x.numpy(), all_rows)
        assert (hits >= 0).all()
        assert len(set(hits.tolist())) == len(split)  # distinct raw rows
    test_rows = raw.iloc[_matches(ds.test.x.numpy(), all_rows)]
    np.testing.assert_array_equal(pre.transform(test_rows), ds.test.x.numpy())


def test_parquet_file_gives_the_same_dataset_as_the_csv(csv: Path, tmp_path: Path):
    parquet = tmp_path / "loans.parquet"
    pd.read_csv(csv).to_parquet(parquet)
    from_csv = load_dataset("loans", table_options(csv))
    from_parquet = load_dataset("loans", table_options(parquet))
    assert from_parquet.meta["data_version"] == hashlib.md5(parquet.read_bytes()).hexdigest()
    assert from_parquet.group_names == from_csv.group_names
    for a, b in zip(from_csv.splits().values(), from_parquet.splits().values(), strict=True):
        assert torch_equal(a.x, b.x) and torch_equal(a.y, b.y) and torch_equal(a.g, b.g)


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_drop_policy_and_overridden_column_types(csv: Path):
    ds = load_dataset("loans", table_options(csv, missing="drop", categorical=["Alter"],
                                             features=["Alter", "Beruf"]))
    assert len(ds.train) + len(ds.val) + len(ds.test) < 900  # rows with a missing value gone
    assert ds.preprocessor.columns == ["Alter", "Beruf"]
    assert ds.preprocessor.numeric == [] and ds.input_shape[0] > 50  # every age one-hot


def test_multiclass_target_and_dataset_from_frame():
    frame = loans_frame().dropna()
    frame["Stufe"] = pd.cut(frame["Einkommen"], 3, labels=["niedrig", "mittel", "hoch"])
    ds = dataset_from_frame(frame.astype({"Stufe": str}), target="Stufe", protected="Herkunft",
                            features=["Alter", "Beruf", "Geschlecht"], name="stufen", seed=3)
    assert ds.name == "stufen" and ds.n_classes == 3 and ds.group_names == ["Nord", "Ost", "Sued"]
    assert sorted(ds.class_names) == ["hoch", "mittel", "niedrig"]
    assert ds.preprocessor.columns == ["Alter", "Beruf", "Geschlecht"]
    again = dataset_from_frame(frame.astype({"Stufe": str}), target="Stufe",
                               protected="Herkunft", features=["Alter", "Beruf", "Geschlecht"],
                               name="stufen", seed=3)
    assert torch_equal(ds.test.x, again.test.x)
    assert ds.meta["data_version"] == again.meta["data_version"]


def test_cli_prepares_a_declared_dataset_and_a_file(csv: Path, tmp_path: Path):
    params = write_params(tmp_path / "params.yaml", {"loans": table_options(csv)}, "loans")
    out = tmp_path / "prepared"
    runner = CliRunner()
    result = runner.invoke(app, ["data", "prepare", "loans", "--params", str(params),
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "w × Ost" in result.output
    ds = load_prepared(out / "loans")
    fresh = load_dataset("loans", table_options(csv))
    assert torch_equal(ds.test.x, fresh.test.x)
    assert ds.meta["data_version"] == fresh.meta["data_version"]
    np.testing.assert_array_equal(ds.preprocessor.transform(pd.read_csv(csv).head(5)),
                                  fresh.preprocessor.transform(pd.read_csv(csv).head(5)))

    args = ["data", "prepare", str(csv), "--target", TARGET, "--missing", "drop",
            "--params", str(params), "--out", str(out)]
    for column in PROTECTED:
        args += ["--protected", column]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert load_prepared(out / "loans").class_names == ["ja", "nein"]  # no positive label

    result = runner.invoke(app, ["data", "prepare", str(csv), "--params", str(params)])
    said = " ".join(result.output.split())  # the console wraps where the temporary path ends
    assert result.exit_code == 2 and "needs --target COLUMN and --protected" in said, said


def test_undeclared_and_late_registered_datasets_get_clear_answers(csv: Path, tmp_path: Path,
                                                                   monkeypatch):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"datasets": {"loans": {"path": str(csv)}}}))
    with pytest.raises(Exception, match="datasets.loans: unknown dataset 'loans'.*kind: "
                                        "table | image_folder"):
        load_params(path)
    write_params(path, {"loans": table_options(csv)}, "lons")
    with pytest.raises(Exception, match="experiment.dataset: unknown dataset 'lons'; did you "
                                        "mean 'loans'"):
        load_params(path)
    # registered in Python after dpfair.config.params was imported: its defaults, no AttributeError
    monkeypatch.setitem(_REGISTRY, "late", DatasetSpec("late", DatasetOptions, lambda o: None,
                                                       "late", needs_files=False))
    assert Params().dataset("late") == DatasetOptions()
    path.write_text(yaml.safe_dump({"datasets": {"late": {"seed": 1}}}))
    with pytest.raises(Exception, match="registered after dpfair.config.params was imported"):
        load_params(path)


@pytest.mark.skipif(importlib.util.find_spec("dvc") is None, reason="dvc is not installed")
def test_dvc_add_records_the_data_version(csv: Path, tmp_path: Path):
    dvc = [sys.executable, "-m", "dvc"]
    env_run = {"cwd": tmp_path, "check": True, "capture_output": True}
    subprocess.run([*dvc, "init", "--no-scm", "-q"], **env_run)
    subprocess.run([*dvc, "add", "-q", csv.name], **env_run)
    recorded = yaml.safe_load((tmp_path / "loans.csv.dvc").read_text())["outs"][0]["md5"]
    assert recorded == source_version("loans", table_options(csv))
    shutil.rmtree(tmp_path / ".dvc")


def test_declared_ranges_and_categories_use_no_statistic_of_the_data(csv: Path):
    declared = {"numeric_ranges": {"Alter": [0, 100], "Einkommen": [0, 10000]},
                "categories": {"Beruf": ["Buero", "Handwerk", "Pflege", "Lehre", "Sonst"]}}
    one = load_dataset("loans", table_options(csv, seed=1, **declared))
    two = load_dataset("loans", table_options(csv, seed=2, **declared))
    assert one.preprocessor.data_independent and "no statistic" in one.meta["preprocessing"]
    raw = pd.read_csv(csv)
    x = one.preprocessor.transform(raw)
    np.testing.assert_array_equal(x, two.preprocessor.transform(raw))  # other training rows
    np.testing.assert_allclose(x[:, 0], raw["Alter"] / 100 * 2 - 1, rtol=1e-6)
    assert x.shape[1] == 2 + 5  # every declared category, seen or not
    missing_income = raw["Einkommen"].isna().to_numpy()
    assert (x[missing_income, 1] == 0).all()  # imputed with the middle of the range
    partly = load_dataset("loans", table_options(csv, numeric_ranges={"Alter": [0, 100]}))
    assert not partly.preprocessor.data_independent
    assert "Einkommen, Beruf" in partly.meta["preprocessing"]
    with pytest.raises(Exception, match=r"column 'Beruf' .* not among its declared categories"):
        load_dataset("loans", table_options(csv, categories={"Beruf": ["Buero"]}))
