"""Seeded, deterministic splitting into ``Split`` arrays."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dpfair.data.dataset import GroupedDataset, Split
from dpfair.errors import DataError

if TYPE_CHECKING:
    from dpfair.data.options import HoldoutOptions


def rng(seed: int, stream: int = 0) -> np.random.Generator:
    """A generator for one purpose (``stream``) of one seed: streams never share draws."""
    return np.random.default_rng([seed, stream])


def holdout(n: int, fraction: float, seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle ``range(n)`` and return (kept, held out) indices, ``int(fraction * n)`` held out.

    As in the papers' code (fair-dp ``make_tabular_train_valid_test_split``): shuffle, then
    take the first ``int(fraction * n)`` rows. Both parts are returned in shuffled order.
    """
    perm = rng(seed, stream).permutation(n)
    n_out = int(fraction * n)
    return perm[n_out:], perm[:n_out]


def ratio_index(
    g: np.ndarray, ratios: list[float], seed: int, names: list[str]
) -> np.ndarray:
    """Sorted rows of the largest subsample whose group sizes are proportional to ``ratios``.

    With ``n_k`` rows in group ``k``, the scale is ``s = min_k n_k / r_k`` and group ``k`` keeps
    ``floor(r_k * s)`` rows (all of the limiting group), drawn without replacement. fair-dp's
    ``find_sample_weights`` gives the same expected sizes when the largest ratio is 1.
    """
    if len(ratios) != len(names):
        raise DataError(
            f"group_ratios has {len(ratios)} entries but the dataset has {len(names)} groups "
            f"{names}: give one ratio per group, in that order"
        )
    rows = [np.flatnonzero(g == k) for k in range(len(names))]
    empty = [name for name, r in zip(names, rows, strict=True) if len(r) == 0]
    if empty:
        raise DataError(f"cannot subsample by group_ratios: groups {empty} have no rows")
    scale = min(len(r) / ratio for r, ratio in zip(rows, ratios, strict=True))
    gen = rng(seed, stream=5)
    keep = []
    for r, ratio, name in zip(rows, ratios, names, strict=True):
        n_keep = min(len(r), math.floor(ratio * scale + 1e-9))
        if n_keep == 0:
            raise DataError(
                f"group_ratios {ratios} keep no row of group {name!r}: raise its ratio"
            )
        keep.append(gen.choice(r, size=n_keep, replace=False))
    return np.sort(np.concatenate(keep))


def make_split(x: np.ndarray, y: np.ndarray, g: np.ndarray, divisor: float = 1.0) -> Split:
    """A split with the agreed dtypes: x float32 (divided by ``divisor``), y and g int64."""
    xf = np.ascontiguousarray(x, dtype=np.float32)
    if divisor != 1.0:
        xf = np.divide(xf, np.float32(divisor), dtype=np.float32)
    return Split(_owned(xf), _long(y), _long(g))


def _owned(a: np.ndarray) -> np.ndarray:
    """A writable array not shared with the loaders' in-process caches (read-only arrays)."""
    return a if a.flags.writeable and a.flags.owndata else a.copy()


def _long(a: np.ndarray) -> np.ndarray:
    return _owned(np.ascontiguousarray(a, dtype=np.int64))


def train_val_test(
    x: np.ndarray,
    y: np.ndarray,
    g: np.ndarray,
    *,
    seed: int,
    test_fraction: float,
    validation_fraction: float,
    divisor: float = 1.0,
) -> tuple[Split, Split, Split]:
    """Random test split of all rows, then the validation split carved from the rest."""
    rest, test = holdout(len(y), test_fraction, seed, stream=1)
    keep, val = holdout(len(rest), validation_fraction, seed, stream=2)
    train, val = rest[keep], rest[val]
    return (
        make_split(x[train], y[train], g[train], divisor),
        make_split(x[val], y[val], g[val], divisor),
        make_split(x[test], y[test], g[test], divisor),
    )


def holdout_dataset(name: str, opts: HoldoutOptions, x: np.ndarray, y: np.ndarray,
                    g: np.ndarray, *, class_names: Sequence[str], group_names: Sequence[str],
                    meta: dict[str, Any]) -> GroupedDataset:
    """Dataset ``name`` of an encoded table without an official split: :func:`train_val_test`
    at ``opts``' seed and fractions; ``meta`` plus ``opts`` as ``meta["options"]``."""
    train, val, test = train_val_test(
        x, y, g, seed=opts.seed,
        test_fraction=opts.test_fraction, validation_fraction=opts.validation_fraction,
    )
    return GroupedDataset(
        name=name, train=train, val=val, test=test,
        class_names=list(class_names), group_names=list(group_names),
        meta={"options": opts.model_dump(mode="json", exclude_none=True), **meta},
    )


def carve_validation(
    x: np.ndarray,
    y: np.ndarray,
    g: np.ndarray,
    *,
    seed: int,
    validation_fraction: float,
    divisor: float = 1.0,
) -> tuple[Split, Split]:
    """Split an official training set into train and validation (each kept in file order)."""
    keep, val = holdout(len(y), validation_fraction, seed, stream=2)
    keep.sort()
    val.sort()
    return (
        make_split(x[keep], y[keep], g[keep], divisor),
        make_split(x[val], y[val], g[val], divisor),
    )


def _pool_rare(strata: np.ndarray) -> np.ndarray:
    values, counts = np.unique(strata, return_counts=True)
    rare = np.isin(strata, values[counts < 2])
    out = strata.copy()
    out[rare] = -1
    if rare.sum() == 1:
        out[rare] = values[np.argmax(counts)]
    return out


def _holdout(index: np.ndarray, strata: np.ndarray, fraction: float,
             seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    if fraction == 0 or len(index) < 2:
        return index, index[:0]
    try:
        kept, held = train_test_split(index, test_size=fraction, random_state=seed,
                                      stratify=_pool_rare(strata))
    except ValueError:  # fewer held-out rows than strata: a plain seeded split
        kept, held = train_test_split(index, test_size=fraction, random_state=seed)
    return np.asarray(kept), np.asarray(held)


def split_index(y: np.ndarray, g: np.ndarray, opts: HoldoutOptions,
                people: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded (train, val, test) row indices stratified by group and label; with ``people``
    (a person id per row: the privacy unit is a person) whole people are split, each
    stratified by its first row, so no person is in two splits."""
    strata = g * (int(y.max()) + 1) + y
    if people is None:
        rest, test = _holdout(np.arange(len(y)), strata, opts.test_fraction, opts.seed)
        train, val = _holdout(rest, strata[rest], opts.validation_fraction, opts.seed)
        return train, val, test
    _, first, owner = np.unique(people, return_index=True, return_inverse=True)
    rest, test = _holdout(np.arange(len(first)), strata[first], opts.test_fraction, opts.seed)
    train, val = _holdout(rest, strata[first][rest], opts.validation_fraction, opts.seed)
    return tuple(np.flatnonzero(np.isin(owner, chosen)) for chosen in (train, val, test))
