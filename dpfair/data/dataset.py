"""The one data structure every dataset yields."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    ArrayOrTensor = np.ndarray | torch.Tensor


class Split:
    """One split: features ``x`` (float32), labels ``y`` (int64), group ids ``g`` (int64).

    Made from NumPy arrays (the loaders, the prepared files) or from tensors. ``x``, ``y`` and
    ``g`` are tensors: from arrays they are made on first use and share the arrays' memory
    (``torch.from_numpy``), so a command that only prepares data loads no torch. ``arrays()``
    gives the NumPy arrays.
    """

    __slots__ = ("_x", "_y", "_g")

    def __init__(self, x: ArrayOrTensor, y: ArrayOrTensor, g: ArrayOrTensor) -> None:
        n = x.shape[0]
        if tuple(y.shape) != (n,) or tuple(g.shape) != (n,):
            raise ValueError(
                f"split shapes disagree: x {tuple(x.shape)}, y {tuple(y.shape)}, "
                f"g {tuple(g.shape)}"
            )
        self._x, self._y, self._g = x, y, g

    @property
    def x(self) -> torch.Tensor:
        self._x = _tensor(self._x)
        return self._x

    @property
    def y(self) -> torch.Tensor:
        self._y = _tensor(self._y)
        return self._y

    @property
    def g(self) -> torch.Tensor:
        self._g = _tensor(self._g)
        return self._g

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of one row's features (``x.shape[1:]``)."""
        return tuple(self._x.shape[1:])

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(x, y, g)`` as NumPy arrays (sharing the tensors' memory on the CPU)."""
        return _array(self._x), _array(self._y), _array(self._g)

    def __len__(self) -> int:
        return int(self._x.shape[0])

    def subset(self, index: torch.Tensor | np.ndarray) -> Split:
        import torch

        index = torch.as_tensor(index, dtype=torch.long)
        return Split(self.x[index], self.y[index], self.g[index])


def _tensor(a: ArrayOrTensor) -> torch.Tensor:
    if isinstance(a, np.ndarray):
        import torch

        return torch.from_numpy(a)
    return a


def _array(a: ArrayOrTensor) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.detach().cpu().numpy()


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
        return self.train.row_shape

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
