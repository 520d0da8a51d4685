""""Skewed" training sets: keep only part of one class (Xu et al. 2021, Sec. 6.1.1;
Esipova et al. 2023, App. B.1; Zhao et al., App. A.1).

Xu keeps exactly 500 training samples of class 8 (``minority_count: 500``); Esipova and Zhao
keep about 9% of class 8 (``minority_fraction: 0.09``, the default), i.e. about 1% of the
training set. Esipova's code samples each row with probability 9%; here the kept count is
exact: ``round(fraction * n_class)`` rows chosen without replacement (seeded). Other classes
and the test set are untouched.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from pydantic import Field, model_validator

from dpfair.data.options import DatasetOptions
from dpfair.data.splits import rng
from dpfair.errors import DataError


class SkewOptions(DatasetOptions):
    """Which class is made a minority and how much of it is kept: exactly one of
    ``minority_fraction`` (fraction kept) and ``minority_count`` (rows kept)."""

    default_minority_fraction: ClassVar[float] = 0.09

    minority_class: int = Field(8, ge=0, le=9, description="class undersampled in train")
    minority_fraction: float | None = Field(
        None, gt=0.0, le=1.0, description="fraction of the minority class kept (default 0.09)"
    )
    minority_count: int | None = Field(
        None, ge=1, description="exact number of minority-class rows kept (Xu: 500)"
    )

    @model_validator(mode="before")
    @classmethod
    def _exactly_one(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        has_fraction = data.get("minority_fraction") is not None
        has_count = data.get("minority_count") is not None
        if has_fraction and has_count:
            raise ValueError(
                "give exactly one of minority_fraction and minority_count, not both"
            )
        if not has_fraction and not has_count:
            if "minority_fraction" in data or "minority_count" in data:
                raise ValueError("give exactly one of minority_fraction and minority_count")
            data = {**data, "minority_fraction": cls.default_minority_fraction}
        return data


def skew_index(y: np.ndarray, opts: SkewOptions) -> np.ndarray:
    """Sorted indices of the rows kept: every row of other classes, part of the minority."""
    rows = np.flatnonzero(y == opts.minority_class)
    if opts.minority_count is not None:
        n_keep = opts.minority_count
    else:
        assert opts.minority_fraction is not None
        n_keep = max(1, round(opts.minority_fraction * len(rows)))
    if n_keep > len(rows):
        raise DataError(
            f"minority_count={n_keep} exceeds the {len(rows)} training rows of class "
            f"{opts.minority_class}"
        )
    kept = rng(opts.seed, stream=4).choice(rows, size=n_keep, replace=False)
    return np.sort(np.concatenate([np.flatnonzero(y != opts.minority_class), kept]))
