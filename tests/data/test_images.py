"""MNIST (skewed), Fashion-MNIST, IDX parsing and digits (Xu 6.1.1, Esipova B.1, Zhao A.1)."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from dpfair.data import DataError, load_dataset
from dpfair.data.idx import read_idx
from dpfair.data.mnist import read_raw
from dpfair.errors import ConfigError


@pytest.fixture(scope="module")
def mnist_raw(mirror):
    return read_raw("mnist")


def _trainval_counts(ds) -> list[int]:
    return torch.bincount(torch.cat([ds.train.y, ds.val.y]), minlength=10).tolist()


def test_mnist_official_sizes(mnist_raw):
    assert mnist_raw["train_x"].shape == (60_000, 28, 28)
    assert mnist_raw["train_y"].shape == (60_000,)
    assert mnist_raw["test_x"].shape == (10_000, 28, 28)
    assert mnist_raw["test_y"].shape == (10_000,)
    assert np.bincount(mnist_raw["train_y"]).tolist()[8] == 5_851


def test_mnist_skewed_fraction(mnist_default, mnist_raw):
    ds = mnist_default  # defaults: keep 9% of class 8
    raw_counts = np.bincount(mnist_raw["train_y"], minlength=10).tolist()
    counts = _trainval_counts(ds)
    assert counts[8] == round(0.09 * 5_851) == 527
    assert [c for k, c in enumerate(counts) if k != 8] == [
        c for k, c in enumerate(raw_counts) if k != 8
    ]
    assert len(ds.val) == int(0.1 * sum(counts))
    assert ds.input_shape == (1, 28, 28) and ds.train.x.dtype == torch.float32
    assert float(ds.train.x.min()) == 0.0 and float(ds.train.x.max()) == 1.0
    assert torch.equal(ds.train.g, ds.train.y)  # groups are the classes
    # test untouched: exactly the official test set, in file order
    expected = torch.from_numpy(mnist_raw["test_x"][:, None].astype(np.float32) / 255)
    assert torch.equal(ds.test.x, expected)
    assert ds.test.y.tolist() == mnist_raw["test_y"].tolist()


def test_mnist_skewed_count_other_classes_untouched(mirror, mnist_raw):
    ds = load_dataset("mnist", {"minority_count": 500, "validation_fraction": 0.0})
    assert len(ds.train) == 54_649  # Xu Table 1
    assert _trainval_counts(ds)[8] == 500
    # every non-8 training image is kept, pixel for pixel and in order
    raw = mnist_raw["train_x"][mnist_raw["train_y"] != 8]
    mine = ds.train.x[ds.train.y != 8]
    assert torch.equal(mine, torch.from_numpy(raw[:, None].astype(np.float32) / 255))
    assert len(ds.test) == 10_000


def test_mnist_skew_options_exactly_one(mirror):
    with pytest.raises(ConfigError, match="exactly one of minority_fraction and minority_count"):
        load_dataset("mnist", {"minority_fraction": 0.1, "minority_count": 500})
    with pytest.raises(ConfigError, match="exactly one"):
        load_dataset("mnist", {"minority_fraction": None, "minority_count": None})
    with pytest.raises(ConfigError, match=r"datasets\.mnist\.minority_fraction"):
        load_dataset("mnist", {"minority_fraction": 0.0})
    with pytest.raises(DataError, match="exceeds the 5851 training rows of class 8"):
        load_dataset("mnist", {"minority_count": 6000})


def test_fashion_mnist_balanced(mirror):
    ds = load_dataset("fashion_mnist", {"validation_fraction": 0.0})
    assert len(ds.train) == 60_000 and len(ds.test) == 10_000
    assert torch.bincount(ds.train.y).tolist() == [6_000] * 10
    assert torch.bincount(ds.test.y).tolist() == [1_000] * 10
    assert ds.class_names[0] == "T-shirt/top" and ds.input_shape == (1, 28, 28)


def _write_idx(path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}i", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_idx_roundtrip_and_errors(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "ok.gz", arr)
    assert np.array_equal(read_idx(str(tmp_path / "ok.gz")), arr)
    with gzip.open(tmp_path / "bad.gz", "wb") as f:
        f.write(b"\x00\x00\x0d\x01" + struct.pack(">i", 3) + b"abc")
    with pytest.raises(DataError, match="not an unsigned-byte IDX"):
        read_idx(str(tmp_path / "bad.gz"))
    with gzip.open(tmp_path / "short.gz", "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + struct.pack(">i", 5) + b"abc")
    with pytest.raises(DataError, match="expected 13"):
        read_idx(str(tmp_path / "short.gz"))


def test_digits_images_and_skew():
    ds = load_dataset("digits")
    assert ds.input_shape == (1, 8, 8)
    for split in ds.splits().values():
        assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
        assert 0.0 <= float(split.x.min()) and float(split.x.max()) <= 1.0
    assert float(ds.train.x.max()) == 1.0
    n_test = int(0.2 * 1_797)
    assert len(ds.test) == n_test
    counts = _trainval_counts(ds)
    unskewed = load_dataset("digits", {"minority_fraction": 1.0})
    full = _trainval_counts(unskewed)
    assert counts[8] == round(0.3 * full[8])  # the digits default (MNIST's is 0.09)
    assert [c for k, c in enumerate(counts) if k != 8] == [c for k, c in enumerate(full) if k != 8]
    # the test split does not depend on the skew
    assert torch.equal(ds.test.x, unskewed.test.x) and torch.equal(ds.test.y, unskewed.test.y)
    counted = load_dataset("digits", {"minority_count": 5, "minority_class": 3})
    assert _trainval_counts(counted)[3] == 5 and _trainval_counts(counted)[8] == full[8]
