"""Prepared data loads without running code, and only as it was prepared (issue 33.3)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpfair.data import load_dataset, load_prepared, prepare
from dpfair.data.prepared import file_md5, write_npz
from dpfair.data.preprocess import TablePreprocessor
from dpfair.errors import DataError

from .own_tables import loans_frame, table_options


class _Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    csv = tmp_path / "loans.csv"
    loans_frame().to_csv(csv, index=False)
    prepare("loans", table_options(csv), tmp_path / "prepared")
    return tmp_path / "prepared" / "loans"


def test_the_transform_is_json_inside_the_arrays_and_a_planted_pickle_never_runs(prepared,
                                                                                tmp_path):
    marker = tmp_path / "ran.txt"
    (prepared / "preprocessor.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    ds = load_prepared(prepared, md5=file_md5(prepared / "arrays.npz"))
    fresh = load_dataset("loans", table_options(tmp_path / "loans.csv"))
    raw = pd.read_csv(tmp_path / "loans.csv").head(20)
    np.testing.assert_array_equal(ds.preprocessor.transform(raw),
                                  fresh.preprocessor.transform(raw))
    assert not marker.exists()


def test_old_prepared_folders_with_a_pickle_are_refused_unread(prepared, tmp_path):
    """Arrays without the JSON transform but with a pickle beside them (an older dpfair's, or
    a planted one): refused, the pickle never loaded."""
    with np.load(prepared / "arrays.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "preprocessor"}
    write_npz(prepared / "arrays.npz", arrays)
    marker = tmp_path / "ran.txt"
    (prepared / "preprocessor.pkl").write_bytes(pickle.dumps(_Planted(marker)))
    with pytest.raises(DataError, match="no longer loads"):
        load_prepared(prepared)
    assert not marker.exists()


def test_arrays_changed_after_preparing_are_refused_by_their_recorded_md5(prepared):
    recorded = file_md5(prepared / "arrays.npz")
    with np.load(prepared / "arrays.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["y_train"] = 1 - arrays["y_train"]  # labels flipped by someone with file access
    write_npz(prepared / "arrays.npz", arrays)
    with pytest.raises(DataError, match=rf"has md5 \w+, not the {recorded} recorded"):
        load_prepared(prepared, md5=recorded)


def test_a_transform_text_that_is_not_one_is_a_clear_error():
    with pytest.raises(DataError, match="is not a dpfair table transform"):
        TablePreprocessor.from_json(pickle.dumps(object()), "x.json")
    with pytest.raises(DataError, match="is not a dpfair table transform"):
        TablePreprocessor.from_json('{"format": "dpfair.table_transform/1"}', "x.json")
