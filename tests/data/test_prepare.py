"""prepare / load_prepared / data_version: atomic, deterministic outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from dpfair.data import (
    DataError,
    data_version,
    load_dataset,
    load_prepared,
    prepare,
    summarize,
)
from dpfair.data import prepared as prepare_mod
from dpfair.data.prepared import EXACT_COUNTS, PUBLIC_SUMMARY
from dpfair.data.sources import md5sum
from dpfair.errors import ConfigError

SMALL = {"n": 300, "n_features": 3}
PUBLIC_KEYS = ("dataset", "input_shape", "n_features", "n_classes", "n_groups", "rows",
               "class_names", "group_names", "privacy")


def test_prepare_writes_arrays_and_public_summary(tmp_path):
    summary = prepare("synthetic", SMALL, tmp_path)
    out = tmp_path / "synthetic"
    assert sorted(p.name for p in out.iterdir()) == ["arrays.npz", "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synthetic"]  # no temp dirs left
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == summary
    assert summary == {
        "dataset": "synthetic",
        "input_shape": [3],
        "n_features": 3,
        "n_classes": 2,
        "n_groups": 2,
        "rows": {"train": 216, "val": 24, "test": 60, "total": 300},
        "class_names": ["0", "1"],
        "group_names": ["majority", "minority"],
        "privacy": PUBLIC_SUMMARY,
    }
    assert "no per-class or per-group counts" in summary["privacy"]


def test_public_summary_of_images():
    ds = load_dataset("digits")
    summary = summarize(ds)
    assert summary["input_shape"] == [1, 8, 8] and summary["n_features"] == 64
    assert summary["class_names"] == ds.class_names and summary["n_classes"] == 10
    assert summary["group_names"] == ds.group_names
    assert sorted(summary) == sorted(PUBLIC_KEYS)  # nothing beyond the public facts
    assert summary["rows"]["train"] == len(ds.train)


def test_exact_counts_are_opt_in_and_marked_not_private(tmp_path):
    summary = prepare("synthetic", SMALL, tmp_path, exact_counts=True)
    assert json.loads((tmp_path / "synthetic" / "summary.json").read_text()) == summary
    assert summary["privacy"] == EXACT_COUNTS == "exact counts: not private (opt-in)"
    ds = load_dataset("synthetic", SMALL)
    assert sorted(summary) == sorted((*PUBLIC_KEYS, "per_class", "per_group"))
    assert {k: v for k, v in summary.items() if k in PUBLIC_KEYS} == {
        **summarize(ds), "privacy": EXACT_COUNTS
    }
    for split, s in ds.splits().items():
        assert summary["per_class"][split] == {
            "0": int((s.y == 0).sum()), "1": int((s.y == 1).sum())
        }
        assert summary["per_group"][split] == {
            "majority": int((s.g == 0).sum()), "minority": int(s.g.sum())
        }
    # the arrays do not depend on what the summary holds
    prepare("synthetic", SMALL, tmp_path / "public")
    assert md5sum(tmp_path / "public" / "synthetic" / "arrays.npz") == md5sum(
        tmp_path / "synthetic" / "arrays.npz"
    )


def test_load_prepared_roundtrip(tmp_path):
    prepare("digits", None, tmp_path)
    back = load_prepared(tmp_path / "digits")
    ds = load_dataset("digits")
    assert back.name == "digits" and back.class_names == ds.class_names
    assert back.group_names == ds.group_names and back.meta == ds.meta
    for key, split in ds.splits().items():
        other = back.splits()[key]
        assert torch.equal(other.x, split.x) and other.x.dtype == torch.float32
        assert torch.equal(other.y, split.y) and other.y.dtype == torch.int64
        assert torch.equal(other.g, split.g) and other.g.dtype == torch.int64
    assert load_prepared(tmp_path / "digits" / "arrays.npz").input_shape == (1, 8, 8)
    with np.load(tmp_path / "digits" / "arrays.npz") as z:  # images stored as exact pixels
        assert z["pixels_train"].dtype == np.uint8 and "x_train" not in z.files


def test_pixels_only_when_exact():
    x = np.array([[0.0, 0.5, 1.0]], dtype=np.float32)
    assert prepare_mod._pixels(x, 2.0).tolist() == [[0, 1, 2]]
    assert prepare_mod._pixels(x, 3.0) is None  # 0.5 * 3 is no integer
    assert prepare_mod._pixels(x * 300, 1.0) is None  # out of uint8 range


def test_prepare_is_byte_deterministic(tmp_path):
    prepare("synthetic", SMALL, tmp_path / "a")
    prepare("synthetic", SMALL, tmp_path / "b")
    a, b = (tmp_path / d / "synthetic" / "arrays.npz" for d in "ab")
    assert md5sum(a) == md5sum(b)
    prepare("synthetic", {**SMALL, "seed": 1}, tmp_path / "c")
    assert md5sum(tmp_path / "c" / "synthetic" / "arrays.npz") != md5sum(a)


def test_failed_prepare_leaves_nothing_and_keeps_old_output(tmp_path, monkeypatch):
    prepare("synthetic", SMALL, tmp_path)
    before = md5sum(tmp_path / "synthetic" / "arrays.npz")

    def broken(path, arrays):
        path.write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(prepare_mod, "write_npz", broken)
    with pytest.raises(OSError, match="disk full"):
        prepare("synthetic", {**SMALL, "seed": 5}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synthetic"]
    assert md5sum(tmp_path / "synthetic" / "arrays.npz") == before
    with pytest.raises(OSError):
        prepare("digits", None, tmp_path / "fresh")
    assert list((tmp_path / "fresh").iterdir()) == []


def test_prepare_bad_options_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match="datasets.synthetic.validation_fraction"):
        prepare("synthetic", {"validation_fraction": 1.5}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_load_prepared_errors(tmp_path):
    with pytest.raises(DataError, match="no prepared dataset"):
        load_prepared(tmp_path / "nothing")
    (tmp_path / "arrays.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="corrupt prepared dataset"):
        load_prepared(tmp_path)


def test_data_version_reads_lock(tmp_path):
    lock = tmp_path / "dvc.lock"
    assert data_version("adult", lock) is None
    lock.write_text(yaml.safe_dump({"schema": "2.0", "stages": {
        "prepare@adult": {"outs": [
            {"path": "data/prepared/adult/summary.json", "md5": "s" * 32},
            {"path": "data/prepared/adult/arrays.npz", "md5": "a" * 32},
        ]},
    }}))
    assert data_version("adult", lock) == "a" * 32
    assert data_version("dutch", lock) is None
