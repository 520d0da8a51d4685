"""scikit-learn's bundled 8x8 digits, class 8 skewed: the embedded default, no files needed.

1,797 images (n, 1, 8, 8), pixel / 16 so values lie in [0, 1]; groups are the classes. A seeded
test split (``test_fraction``) is taken first and left untouched; the training part is then
skewed (``skew.py``, default: keep 30% of class 8) and the validation split carved from it.
MNIST's 9% would leave 11 training images of class 8 here, too few for any private model to
learn the class at all; at 30% (38 images) the demo shows DPSGD's disparate impact and what
the fair methods recover.
"""

from __future__ import annotations

import gzip
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import Field

from dpfair.data.dataset import GroupedDataset
from dpfair.data.registry import register
from dpfair.data.skew import SkewOptions, skew_index
from dpfair.data.splits import carve_validation, holdout, make_split
from dpfair.data.version import file_version
from dpfair.errors import DataError

CLASS_NAMES = [str(d) for d in range(10)]


class DigitsOptions(SkewOptions):
    """Options of ``digits`` (no official split: ``test_fraction`` of rows for test)."""

    default_minority_fraction: ClassVar[float] = 0.3

    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="fraction of rows for test")


def _digits_file() -> Path:
    """scikit-learn's bundled ``digits.csv.gz``, found without importing scikit-learn (whose
    import takes seconds; the file is 64 pixel columns and the label, one image a line)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the digits dataset needs scikit-learn installed (pip install "
                        "scikit-learn)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


@lru_cache(maxsize=1)
def _raw() -> tuple[np.ndarray, np.ndarray]:
    """What ``sklearn.datasets.load_digits`` returns (``images``, ``target``), read as it reads
    them (``np.loadtxt`` of the gzipped CSV)."""
    with gzip.open(_digits_file(), mode="rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    x = data[:, :-1].reshape(-1, 1, 8, 8).astype(np.float32)  # values 0..16
    y = data[:, -1].astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def digits_version(opts: DigitsOptions) -> str:
    """md5 of sklearn's bundled digits file (the same for any options)."""
    return file_version(_digits_file())


@register("digits", DigitsOptions, "sklearn 8x8 digits, skewed like MNIST (no files needed)",
          needs_files=False, version=digits_version)
def load_digits(opts: DigitsOptions) -> GroupedDataset:
    x, y = _raw()
    rest, test = holdout(len(y), opts.test_fraction, opts.seed, stream=1)
    rest.sort()
    test.sort()
    xr, yr = x[rest], y[rest]
    keep = skew_index(yr, opts)
    train, val = carve_validation(
        xr[keep], yr[keep], yr[keep], seed=opts.seed,
        validation_fraction=opts.validation_fraction, divisor=16.0,
    )
    return GroupedDataset(
        name="digits", train=train, val=val,
        test=make_split(x[test], y[test], y[test], divisor=16.0),
        class_names=list(CLASS_NAMES), group_names=list(CLASS_NAMES),
        meta={
            "options": opts.model_dump(mode="json"),
            "pixel_scale": 16,
            "source": "sklearn.datasets.load_digits",
        },
    )
