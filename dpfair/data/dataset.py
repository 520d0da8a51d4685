"""The one data structure every dataset yields."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Split:
    """One split: features ``x`` (float32), labels ``y`` (int64), group ids ``g`` (int64)."""

    x: torch.Tensor
    y: torch.Tensor
    g: torch.Tensor

    def __post_init__(self) -> None:
        n = self.x.shape[0]
        if self.y.shape != (n,) or self.g.shape != (n,):
            raise ValueError(
                f"split shapes disagree: x {tuple(self.x.shape)}, y {tuple(self.y.shape)}, "
                f"g {tuple(self.g.shape)}"
            )

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def subset(self, index: torch.Tensor | np.ndarray) -> Split:
        import torch

        index = torch.as_tensor(index, dtype=torch.long)
        return Split(self.x[index], self.y[index], self.g[index])


@dataclass(frozen=True)
class GroupedDataset:
    """Train/validation/test splits with class and group names.

    ``x`` has shape ``(n, d)`` for tabular data and ``(n, c, h, w)`` for images.
    ``meta["data_version"]`` is the md5 of the source (``dpfair.data.source_version``).
    ``preprocessor`` is None for the built-in datasets; for a table read from a file it is the
    transform fitted on the training split (``.columns``: the raw feature columns in order,
    ``.transform(frame) -> float32 array``), so prediction applies the same transform.
    """

    name: str
    train: Split
    val: Split
    test: Split
    class_names: list[str]
    group_names: list[str]
    meta: dict = field(default_factory=dict)
    preprocessor: Any = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def n_groups(self) -> int:
        return len(self.group_names)

    def splits(self) -> dict[str, Split]:
        return {"train": self.train, "val": self.val, "test": self.test}


@dataclass(frozen=True)
class DatasetPreview:
    """What a dataset shows before its rows are split: its group and class names and the input
    shape a model takes. A loader that can (own tables, image folders) hands it to an
    :data:`Inspect` callback before the split, so a check that needs only these (a pair of
    groups, a model built on the shape) refuses before the split's work and imports.

    For a table whose transform is fitted, ``input_shape`` is the width fitted on every row: at
    least the training split's (a category seen only outside it adds a column), so the checks
    repeated on the loaded dataset use the exact shape.
    """

    name: str
    group_names: list[str]
    class_names: list[str]
    input_shape: tuple[int, ...]

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @classmethod
    def of(cls, dataset: GroupedDataset) -> DatasetPreview:
        """The preview of a loaded dataset (its exact shape and names)."""
        return cls(dataset.name, list(dataset.group_names), list(dataset.class_names),
                   dataset.input_shape)


#: A check a loader runs on the preview before the split; it raises to refuse the dataset.
Inspect = Callable[[DatasetPreview], None]
