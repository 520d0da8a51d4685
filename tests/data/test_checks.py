"""Data values: non-finite features and out-of-range ids are refused where data enters dpfair
(every loader's output, every prepared file), naming the source, the feature, the rows and the fix.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpfair.data import DataError, checks, load_dataset, load_prepared, prepare
from dpfair.data import registry as registry_mod
from dpfair.data.dataset import GroupedDataset, Split
from dpfair.data.prepared import ARRAYS, write_npz
from dpfair.data.synthetic import SyntheticOptions
from dpfair.errors import ConfigError

SMALL = {"n": 300, "n_features": 4}


def _rewrite(path, **arrays: np.ndarray) -> None:
    """Replace some arrays of the prepared file ``path`` (as a hand edit would)."""
    with np.load(path, allow_pickle=False) as z:
        content = {k: z[k] for k in z.files}
    write_npz(path, {**content, **arrays})


@pytest.fixture
def prepared(tmp_path):
    prepare("synthetic", SMALL, tmp_path)
    return tmp_path / "synthetic" / ARRAYS


def test_prepared_file_with_nan_in_five_rows_is_refused_naming_file_feature_and_rows(prepared):
    with np.load(prepared) as z:
        x = z["x_train"].copy()
    x[[3, 10, 11, 50, 99], 2] = np.nan
    _rewrite(prepared, x_train=x)
    with pytest.raises(DataError) as err:
        load_prepared(prepared)
    message = str(err.value)
    assert f"prepared dataset {prepared}" in message
    assert "train split: 5 rows hold NaN (feature 2)" in message
    assert "dpfair data prepare synthetic" in message
    assert "val split" not in message and "test split" not in message


def test_prepared_file_with_inf_in_test_split(prepared):
    with np.load(prepared) as z:
        x = z["x_test"].copy()
    x[0, 0], x[0, 3], x[7, 0] = np.inf, -np.inf, np.nan
    _rewrite(prepared, x_test=x)
    with pytest.raises(DataError, match=r"test split: 2 rows hold NaN and inf \(features 0, 3\)"):
        load_prepared(prepared.parent)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("y_train", 2, r"train split: 1 row have labels \(y\) 2, outside 0\.\.1 "
                       r"\(2 names: 0, 1\)"),
        ("g_val", -1, r"val split: 1 row have group ids \(g\) -1, outside 0\.\.1 "
                      r"\(2 names: majority, minority\)"),
    ],
)
def test_prepared_ids_out_of_range_are_refused(prepared, key, value, expected):
    with np.load(prepared) as z:
        ids = z[key].copy()
    ids[0] = value
    _rewrite(prepared, **{key: ids})
    with pytest.raises(DataError, match=expected):
        load_prepared(prepared)


def test_prepared_float_labels_are_refused(prepared):
    with np.load(prepared) as z:
        y = z["y_train"].astype(np.float32)
    _rewrite(prepared, y_train=y)
    with pytest.raises(DataError, match=r"labels \(y\) have dtype float32, not an integer"):
        load_prepared(prepared)


def test_sound_prepared_file_loads_unchanged(prepared):
    ds = load_prepared(prepared)
    fresh = load_dataset("synthetic", SMALL)
    assert torch.equal(ds.train.x, fresh.train.x) and torch.equal(ds.test.g, fresh.test.g)


@pytest.mark.parametrize("key", ["class_sep", "group_shift"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_options_refuse_non_finite_numbers(key, value):
    with pytest.raises(ConfigError, match=rf"datasets\.synthetic\.{key}: Input should be a "
                                          r"finite number"):
        load_dataset("synthetic", {key: value})


def _loader_giving(x_train: torch.Tensor, meta: dict) -> registry_mod.Loader:
    def load(opts: SyntheticOptions) -> GroupedDataset:
        n, d = x_train.shape
        ids = torch.zeros(n, dtype=torch.long)
        empty = Split(torch.zeros(0, d), torch.zeros(0, dtype=torch.long),
                      torch.zeros(0, dtype=torch.long))
        return GroupedDataset("broken", Split(x_train, ids, ids), empty, empty,
                              class_names=["a", "b"], group_names=["g0", "g1"], meta=meta)
    return load


def test_every_loader_output_is_checked_naming_features_and_sources(monkeypatch):
    x = torch.zeros(20, 3)
    x[4:6, 1] = math.inf
    loader = _loader_giving(x, {"feature_names": ["age", "hours", "race"],
                                "sources": {"broken.csv": "md5"}})
    monkeypatch.setitem(registry_mod._REGISTRY, "broken", registry_mod.DatasetSpec(
        "broken", SyntheticOptions, loader, "test", needs_files=False))
    with pytest.raises(DataError) as err:
        load_dataset("broken")
    message = str(err.value)
    assert "dataset 'broken' (read from broken.csv)" in message
    assert "train split: 2 rows hold inf (feature 'hours' (index 1))" in message
    assert "check datasets.broken in the parameters file" in message


def test_finiteness_is_checked_in_every_chunk(monkeypatch):
    monkeypatch.setattr(checks, "_CHUNK_ROWS", 4)
    x = torch.zeros(30, 2)
    x[29, 0] = math.nan
    split = Split(x, torch.zeros(30, dtype=torch.long), torch.zeros(30, dtype=torch.long))
    ds = GroupedDataset("chunks", split, split.subset([]), split.subset([]), ["a"], ["g"])
    with pytest.raises(DataError, match=r"train split: 1 row hold NaN \(feature 0\)"):
        checks.check_values(ds, "chunks", "none")


def test_long_lists_are_shortened():
    x = torch.full((3, 8), math.nan)
    split = Split(x, torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    ds = GroupedDataset("wide", split, split.subset([]), split.subset([]), ["a"], ["g"])
    with pytest.raises(DataError, match=r"3 rows hold NaN \(features 0, 1, 2, 3, 4 and 3 more\)"):
        checks.check_values(ds, "wide", "none")


def test_finite_values_whose_sum_overflows_pass():
    x = torch.full((10, 2), 3e38)  # finite, but their float32 sum is inf
    split = Split(x, torch.zeros(10, dtype=torch.long), torch.zeros(10, dtype=torch.long))
    ds = GroupedDataset("large", split, split.subset([]), split.subset([]), ["a"], ["g"])
    assert checks.check_values(ds, "large", "none") is ds
