"""Every kind of bad data gets a DataError naming the file, the column and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpfair.data import load_dataset, prepare
from dpfair.errors import DataError, SourceMissingError

from .own_tables import TARGET, loans_frame, table_options


def _csv(tmp_path: Path, frame: pd.DataFrame, name: str = "loans.csv") -> Path:
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def _error(path: Path, **options) -> str:
    with pytest.raises(DataError) as info:
        load_dataset("loans", table_options(path, **options))
    return str(info.value)


def test_missing_file(tmp_path: Path):
    with pytest.raises(SourceMissingError, match=r"data file not found: .*nowhere\.csv.*set "
                                                 r"the dataset's path.*dvc pull"):
        load_dataset("loans", table_options(tmp_path / "nowhere.csv"))


def test_unreadable_files(tmp_path: Path):
    parquet = tmp_path / "loans.parquet"
    parquet.write_text("this is not parquet\n")
    msg = _error(parquet)
    assert f"cannot read {parquet} as PARQUET" in msg and "valid PARQUET file" in msg
    binary = tmp_path / "loans.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81garbage\x00" * 50)
    assert f"cannot read {binary} as CSV" in _error(binary)
    odd = tmp_path / "loans.xlsx"
    odd.write_text("x")
    assert "cannot tell the format" in _error(odd)


def test_missing_target_and_protected_columns(tmp_path: Path):
    path = _csv(tmp_path, loans_frame())
    msg = _error(path, target="Ausfal")
    assert f"column 'Ausfal' (target) is not in {path}; did you mean 'Ausfall'?" in msg
    assert "Fix: set datasets.loans.target" in msg
    msg = _error(path, protected=["Geschlecht", "Herkunf"])
    assert "column 'Herkunf' (protected) is not in" in msg and "did you mean 'Herkunft'" in msg
    assert "datasets.loans.protected" in msg


def test_target_with_one_class(tmp_path: Path):
    path = _csv(tmp_path, loans_frame().assign(**{TARGET: "nein"}))
    msg = _error(path, positive_label=None)
    assert f"the target column 'Ausfall' of {path} has a single class ('nein')" in msg
    assert "datasets.loans.target" in msg
    msg = _error(path)  # positive label "ja" never occurs
    assert "datasets.loans.positive_label 'ja' is not a value of the target column" in msg


def test_group_with_too_few_training_rows(tmp_path: Path):
    frame = loans_frame()
    frame.loc[frame.index[:40], "Herkunft"] = "West"
    frame.loc[frame.index[:40], "Geschlecht"] = "w"  # 40 rows of "w × West"
    msg = _error(_csv(tmp_path, frame), min_group_train_rows=30)
    assert "group 'w × West' of" in msg and "(columns Geschlecht, Herkunft)" in msg
    assert "fewer than 30 training rows (datasets.loans.min_group_train_rows)" in msg
    assert "lower datasets.loans.min_group_train_rows" in msg
    ds = load_dataset("loans", table_options(_csv(tmp_path, frame), min_group_train_rows=20))
    assert "w × West" in ds.group_names


def test_missing_values_under_the_error_policy(tmp_path: Path):
    path = _csv(tmp_path, loans_frame())
    msg = _error(path, missing="error")
    assert f"column 'Einkommen' of {path} has missing values (lines " in msg
    assert "datasets.loans.missing is 'error'" in msg and "'drop'" in msg and "'impute'" in msg
    first = int(loans_frame()["Einkommen"].isna().to_numpy().argmax())
    assert f"(lines {first + 2}," in msg  # line 1 is the header


def test_non_numeric_values_in_a_numeric_column(tmp_path: Path):
    frame = loans_frame().astype({"Alter": object})
    frame.loc[[3, 7], "Alter"] = "unbekannt"
    path = _csv(tmp_path, frame)
    msg = _error(path)
    assert (f"column 'Alter' of {path} is numeric but holds non-numeric or infinite values "
            "'unbekannt'") in msg
    assert "(lines 5, 9)" in msg and "datasets.loans.categorical: [Alter]" in msg
    declared = _error(_csv(tmp_path, loans_frame(), "b.csv"), numeric=["Beruf"])
    assert "column 'Beruf'" in declared and "'Buero'" in declared


def test_label_in_test_split_never_seen_in_training(tmp_path: Path):
    frame = loans_frame(n=300)
    frame.loc[0, TARGET] = "vielleicht"  # one row: train or test, depending on the seed
    path = _csv(tmp_path, frame)
    messages = []
    for seed in range(12):
        try:
            ds = load_dataset("loans", table_options(path, positive_label=None, seed=seed,
                                                     validation_fraction=0.0,
                                                     min_group_train_rows=1))
            assert ds.class_names == ["ja", "nein", "vielleicht"]
            assert 2 in ds.train.y.tolist()
        except DataError as exc:
            messages.append(str(exc))
    assert messages, "no seed put the single row in the test split"
    assert all(f"the test split of {path} holds the label 'vielleicht' of the target column "
               "'Ausfall', never seen in the training split" in m for m in messages)


def test_nothing_half_written_after_an_error(tmp_path: Path):
    good = _csv(tmp_path, loans_frame())
    out = tmp_path / "prepared"
    prepare("loans", table_options(good), out)
    before = {p.name: p.read_bytes() for p in (out / "loans").iterdir()}
    assert sorted(before) == ["arrays.npz", "summary.json"]  # the transform is inside arrays
    bad = _csv(tmp_path, loans_frame().assign(Alter="x"), "bad.csv")
    with pytest.raises(DataError):
        prepare("loans", table_options(bad, categorical=[], numeric=["Alter"]), out)
    with pytest.raises(DataError):
        prepare("other", table_options(bad, numeric=["Alter"]), out)
    assert sorted(p.name for p in out.iterdir()) == ["loans"]  # no temporary, no "other"
    assert {p.name: p.read_bytes() for p in (out / "loans").iterdir()} == before


def test_infinite_number_is_refused_with_its_feature(tmp_path: Path):
    frame = loans_frame()
    frame["Einkommen"] = frame["Einkommen"].astype(float)
    frame.loc[5, "Einkommen"] = np.inf
    msg = _error(_csv(tmp_path, frame))
    assert "column 'Einkommen'" in msg and "non-numeric or infinite values 'inf' (lines 7)" in msg


def test_a_repeated_header_is_refused_not_renamed_into_a_feature(tmp_path: Path):
    """pandas would rename a second target column to 'Ausfall.1' and train on it (a label
    leak: 100% accuracy); the file and a DataFrame with a column twice are refused."""
    frame = loans_frame()
    path = tmp_path / "loans.csv"
    frame.assign(copy=frame[TARGET]).rename(columns={"copy": TARGET}).to_csv(path, index=False)
    assert f"the header of {path} names the column(s) 'Ausfall' more than once" in _error(path)
    from dpfair.data.tabular_frame import dataset_from_frame

    twice = pd.concat([frame, frame[[TARGET]]], axis=1)
    with pytest.raises(DataError, match="'Ausfall' more than once"):
        dataset_from_frame(twice, target=TARGET, protected="Geschlecht", positive_label="ja")


def test_a_single_valued_protected_column_is_refused(tmp_path: Path):
    path = _csv(tmp_path, loans_frame().assign(Geschlecht="w", Herkunft="Nord"))
    msg = _error(path)
    assert "hold a single value ('w" in msg
    assert "no groups to compare" in msg and "datasets.loans.protected" in msg


@pytest.mark.parametrize(("change", "expected"), [
    (lambda f: f.assign(Ausfall=np.linspace(0.0, 1.0, len(f)) + 0.5),
     "holds fractional numbers"),
    (lambda f: f.assign(Geschlecht=[str(i % 600) for i in range(len(f))]),
     r"groups '.*', '.*', '.*', '.*', '.*' and \d+ more of"),
    (lambda f: f.head(1), r"has 1 usable row\(s\): too few for two groups"),
])
def test_weak_messages_are_short_and_name_the_problem(tmp_path: Path, change, expected):
    """A continuous target, a 600-valued protected column and a 1-row file each get one short
    message naming the problem (never every value, never a positive_label complaint)."""
    msg = _error(_csv(tmp_path, change(loans_frame(1200))), positive_label=None)
    assert len(msg) < 600, msg
    assert re.search(expected, msg), msg


def test_a_folder_given_as_the_data_file_says_so(tmp_path: Path):
    assert "is a folder; give the CSV or Parquet file in it" in _error(tmp_path)


def test_yaml_booleans_where_strings_were_meant_say_quote_them(tmp_path: Path):
    """Issue 43: `categories: {Buerge: [no, yes]}` reaches dpfair as [False, True]; the error
    says so and how to write them."""
    import yaml

    frame = loans_frame(300)
    frame["Buerge"] = np.where(np.arange(len(frame)) % 3, "yes", "no")
    declared = yaml.safe_load("Buerge: [no, yes]")  # what params.yaml hands over
    msg = _error(_csv(tmp_path, frame), categories=declared)
    assert "quote them: ['no', 'yes']" in msg and "Buerge" in msg, msg


def test_a_yaml_boolean_positive_label_says_quote_it(tmp_path: Path):
    """`positive_label: yes` reaches dpfair as True: the error names the target's values and
    says how to write the label."""
    import yaml

    frame = loans_frame(300)
    frame[TARGET] = np.where(frame[TARGET] == "ja", "yes", "no")
    declared = yaml.safe_load("positive_label: yes")["positive_label"]
    msg = _error(_csv(tmp_path, frame), positive_label=declared)
    assert "'True' is not a value" in msg and "values: no, yes" in msg, msg
    assert 'quote it: "yes" is a string, yes is a boolean' in msg, msg


def test_a_date_column_is_refused_with_the_fix(tmp_path: Path):
    """A date column is neither a number nor a category: refused with the fix (leave it out of
    features or derive numbers); without it in the features the table loads."""
    frame = loans_frame(300)
    frame["Antrag"] = pd.date_range("2024-01-01", periods=len(frame), freq="D").strftime(
        "%Y-%m-%d")
    path = _csv(tmp_path, frame)
    msg = _error(path)
    assert "'Antrag'" in msg and "dates" in msg and "features" in msg, msg
    assert "derive numbers" in msg and "'2024-01-01'" in msg
    features = ["Alter", "Einkommen", "Beruf"]
    assert load_dataset("loans", table_options(path, features=features)).n_groups == 6
    frame["Antrag"] = pd.to_datetime(frame["Antrag"])  # a Parquet file's datetime column
    parquet = tmp_path / "loans.parquet"
    frame.to_parquet(parquet)
    assert "holds dates" in _error(parquet)


def test_transform_honours_unknown(tmp_path: Path):
    """`dataset.preprocessor.transform` (the Python API) refuses a category the model never
    saw under `unknown: error` (the default), as prediction does; `ignore` encodes zeros."""
    frame = loans_frame(300)
    path = _csv(tmp_path, frame)
    rows = frame.drop(columns=[TARGET]).head(3).copy()
    rows["Beruf"] = ["Buero", "Astronaut", "Pflege"]
    dataset = load_dataset("loans", table_options(path))
    with pytest.raises(DataError, match=r"'Astronaut' in row 1.*never saw.*unknown: ignore"):
        dataset.preprocessor.transform(rows)
    ignoring = load_dataset("loans", table_options(path, unknown="ignore"))
    x = ignoring.preprocessor.transform(rows)
    names = ignoring.preprocessor.feature_names
    beruf = [k for k, n in enumerate(names) if n.startswith("Beruf_")]
    assert x.shape == (3, len(names)) and not x[1, beruf].any() and x[0, beruf].sum() == 1
