"""MNIST ("skewed": Esipova App. B.1, Xu Sec. 6.1.1, Zhao App. A.1) and Fashion-MNIST (Zhao A.1).

Official 60,000/10,000 train/test files (IDX gz). Images are (n, 1, 28, 28) float32 in [0, 1]
(pixel / 255); groups are the classes. MNIST's training set is skewed (see ``skew.py``) before
the validation split is carved from it; the test set is untouched. Fashion-MNIST is balanced.
"""

from __future__ import annotations

import numpy as np

from dpfair.data.dataset import GroupedDataset
from dpfair.data.idx import read_idx
from dpfair.data.options import DatasetOptions
from dpfair.data.registry import register
from dpfair.data.skew import SkewOptions, skew_index
from dpfair.data.sources import fetch, source
from dpfair.data.splits import carve_validation, make_split
from dpfair.errors import DataError

FILES = {
    "train_x": "train-images-idx3-ubyte.gz",
    "train_y": "train-labels-idx1-ubyte.gz",
    "test_x": "t10k-images-idx3-ubyte.gz",
    "test_y": "t10k-labels-idx1-ubyte.gz",
}
MNIST_CLASSES = [str(d) for d in range(10)]
FASHION_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]


class MnistOptions(SkewOptions):
    """Options of ``mnist``: skewed training set (default: keep 9% of class 8)."""


class FashionMnistOptions(DatasetOptions):
    """Options of ``fashion_mnist`` (balanced)."""


def read_raw(dataset: str) -> dict[str, np.ndarray]:
    """The four official arrays (uint8, read-only), md5-verified and cached in-process."""
    arrays = {}
    for key, name in FILES.items():
        arrays[key] = read_idx(str(fetch(dataset, name)), source(dataset, name).md5)
    for part in ("train", "test"):
        x, y = arrays[f"{part}_x"], arrays[f"{part}_y"]
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise DataError(f"{dataset}: {part} images {x.shape} and labels {y.shape} disagree")
    return arrays


def _images(dataset: str, train_index: np.ndarray | None, opts: DatasetOptions,
            class_names: list[str]) -> GroupedDataset:
    raw = read_raw(dataset)
    x, y = raw["train_x"], raw["train_y"]
    if train_index is not None:
        x, y = x[train_index], y[train_index]
    x = x[:, None]
    train, val = carve_validation(
        x, y, y, seed=opts.seed, validation_fraction=opts.validation_fraction, divisor=255.0
    )
    tx, ty = raw["test_x"][:, None], raw["test_y"]
    test = make_split(tx, ty, ty, divisor=255.0)
    return GroupedDataset(
        name=dataset, train=train, val=val, test=test,
        class_names=list(class_names), group_names=list(class_names),
        meta={
            "options": opts.model_dump(mode="json"),
            "pixel_scale": 255,
            "n_train_official": int(len(raw["train_y"])),
            "sources": {name: source(dataset, name).md5 for name in FILES.values()},
        },
    )


@register("mnist", MnistOptions, "skewed MNIST: class 8 undersampled in train, groups = classes",
          needs_files=True)
def load_mnist(opts: MnistOptions) -> GroupedDataset:
    index = skew_index(read_raw("mnist")["train_y"], opts)
    return _images("mnist", index, opts, MNIST_CLASSES)


@register("fashion_mnist", FashionMnistOptions, "Fashion-MNIST, balanced, groups = classes",
          needs_files=True)
def load_fashion_mnist(opts: FashionMnistOptions) -> GroupedDataset:
    return _images("fashion_mnist", None, opts, FASHION_CLASSES)
