"""The values every dataset must hold, checked once where data enters dpfair.

``check_values`` runs on every loader's output (``registry.load_dataset``) and on every prepared
file read back (``prepared.load_prepared``): features finite (a NaN or inf in x gives a NaN
model, or a silently different one), labels and group ids integers in ``[0, n_classes)`` and
``[0, n_groups)``. An error names the source, the split, the features (by name where the loader
recorded ``meta["feature_names"]``, else by flattened index), how many rows, and the fix.
"""

from __future__ import annotations

import math

import numpy as np

from dpfair.data.dataset import GroupedDataset, Split
from dpfair.errors import DataError

_CHUNK_ROWS = 8192  # bounds the boolean masks of the exact check (CelebA is ~10 GB of x)
_SHOWN = 5  # at most this many features or values are listed in a message


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def _nonfinite(x: np.ndarray, feature_names: list[str] | None) -> str | None:
    """``"<k> rows hold NaN (features ...)"`` for the rows of ``x`` with a NaN or inf, or None.

    A finite sum proves every value finite (a NaN or inf makes the sum NaN or inf), at the cost
    of one pass and no mask; only when it is not (a bad value, or an overflow of finite values)
    are the rows and features found, chunk by chunk.
    """
    flat = x.reshape(x.shape[0], math.prod(x.shape[1:]))  # -1 is ambiguous for an empty split
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(flat.sum()):
            return None
    rows, has_nan, has_inf = 0, False, False
    columns = np.zeros(flat.shape[1], dtype=bool)
    for start in range(0, flat.shape[0], _CHUNK_ROWS):
        chunk = flat[start:start + _CHUNK_ROWS]
        bad = ~np.isfinite(chunk)
        rows += int(bad.any(axis=1).sum())
        columns |= bad.any(axis=0)
        has_nan |= bool(np.isnan(chunk).any())
        has_inf |= bool(np.isinf(chunk).any())
    if rows == 0:
        return None  # the sum overflowed; every value is finite
    named = feature_names is not None and len(feature_names) == flat.shape[1]
    features = [f"{feature_names[i]!r} (index {i})" if named else str(i)  # type: ignore[index]
                for i in np.flatnonzero(columns).tolist()]
    kinds = " and ".join(k for k, found in (("NaN", has_nan), ("inf", has_inf)) if found)
    return (f"{rows} row{'s' if rows != 1 else ''} hold {kinds} "
            f"(feature{'s' if len(features) != 1 else ''} {_listed(features)})")


def _out_of_range(ids: np.ndarray, what: str, names: list[str]) -> str | None:
    """Why ``ids`` are not integer ids in ``[0, len(names))``, or None."""
    if not np.issubdtype(ids.dtype, np.integer):
        return f"{what} have dtype {ids.dtype}, not an integer type"
    bad = (ids < 0) | (ids >= len(names))
    if not bad.any():
        return None
    values = [str(v) for v in np.unique(ids[bad]).tolist()]
    rows = int(bad.sum())
    return (f"{rows} row{'s' if rows != 1 else ''} have {what} {_listed(values)}, outside "
            f"0..{len(names) - 1} ({len(names)} names: {_listed(names)})")


def _split_problems(split: Split, ds: GroupedDataset) -> list[str]:
    names = ds.meta.get("feature_names")
    x, y, g = split.arrays()
    found = [
        _nonfinite(x, names if isinstance(names, list) else None),
        _out_of_range(y, "labels (y)", ds.class_names),
        _out_of_range(g, "group ids (g)", ds.group_names),
    ]
    return [f for f in found if f is not None]


def check_values(ds: GroupedDataset, source: str, fix: str) -> GroupedDataset:
    """Return ``ds`` if its values are sound, else raise a DataError naming ``source`` and ``fix``.

    Sound: x finite; y and g integer ids below ``n_classes`` / ``n_groups``. Nothing is dropped
    or imputed here: a silent repair would change results without the user knowing.
    """
    problems = [
        f"  {key} split: {problem}"
        for key, split in ds.splits().items()
        for problem in _split_problems(split, ds)
    ]
    if problems:
        raise DataError(f"{source} has bad values:\n" + "\n".join(problems) + f"\nfix: {fix}")
    return ds
