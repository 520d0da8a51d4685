"""Dutch census 2001 (Le Quy et al. 2022's arff), as Esipova et al. 2023, App. B.1.

The arff is already filtered as the paper describes (underage, unemployed, missing and
middle-level occupations removed, weight dropped): 60,420 rows, sex 1 = male (30,147),
sex 2 = female (30,273) -- Esipova App. B.1 and the arff's counts agree; Xu's Table 1 swaps
the two counts. Target: occupation ``2_1`` (high-level, label 1) vs ``5_4_9`` (low-level, 0).

Features as in the papers' code (fair-dp ``preprocess_dutch``): the binary attributes sex
(0 male, 1 female) and prev_residence_place (0/1) are one 0/1 column each, every other
attribute is one-hot over the values present, ordered by attribute then numeric value:
59 input features, matching Esipova's logistic regression with N = 120 parameters.
``group_ratios`` subsamples the groups before the split (the released code's Dutch script uses
``[1, 0.333]``: every man, a third as many women). Seeded 80/20 train/test split, validation
carved from the train part.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from dpfair.data.dataset import GroupedDataset
from dpfair.data.options import GroupRatioOptions
from dpfair.data.registry import register
from dpfair.data.sources import fetch, source
from dpfair.data.splits import holdout_dataset, ratio_index
from dpfair.errors import DataError

FILE = "dutch_census_2001.arff"
TARGET = "occupation"
LABELS = {"5_4_9": 0, "2_1": 1}
CLASS_NAMES = ["low (5_4_9)", "high (2_1)"]
GROUP_NAMES = ["male", "female"]
BINARY = {"sex": {"1": 0, "2": 1}, "prev_residence_place": {"1": 0, "2": 1}}


class DutchOptions(GroupRatioOptions):
    """Options of ``dutch`` (group: sex)."""


def _sort_key(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


@lru_cache(maxsize=1)
def _encoded(path: str, md5: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    from scipy.io import arff

    try:
        records, meta = arff.loadarff(path)
    except Exception as exc:  # scipy raises several types for malformed files
        raise DataError(f"dutch: cannot parse {path}: {exc}") from exc
    cols = {name: np.char.decode(records[name].astype("S"), "ascii") for name in meta.names()}
    if TARGET not in cols or "sex" not in cols:
        raise DataError(f"dutch: {path} lacks the 'occupation' or 'sex' attribute")
    labels = cols.pop(TARGET)
    unknown = set(labels) - set(LABELS)
    if unknown:
        raise DataError(f"dutch: unexpected occupation values {sorted(unknown)} in {path}")
    y = np.array([LABELS[v] for v in labels], dtype=np.int64)
    parts, names = [], []
    for name, values in cols.items():
        if name in BINARY:
            mapping = BINARY[name]
            bad = set(values) - set(mapping)
            if bad:
                raise DataError(f"dutch: unexpected {name} values {sorted(bad)} in {path}")
            parts.append(np.array([mapping[v] for v in values], dtype=np.float64)[:, None])
            names.append(f"{name}={[k for k, v in mapping.items() if v == 1][0]}")
        else:
            levels = sorted(set(values), key=_sort_key)
            index = {v: i for i, v in enumerate(levels)}
            codes = np.array([index[v] for v in values])
            parts.append(np.eye(len(levels))[codes])
            names += [f"{name}={v}" for v in levels]
    x = np.concatenate(parts, axis=1).astype(np.float32)
    g = np.array([BINARY["sex"][v] for v in cols["sex"]], dtype=np.int64)
    for arr in (x, y, g):
        arr.flags.writeable = False
    return x, y, g, tuple(names)


@register("dutch", DutchOptions, "Dutch census 2001, occupation high/low, group sex",
          needs_files=True)
def load_dutch(opts: DutchOptions) -> GroupedDataset:
    path: Path = fetch("dutch", FILE)
    md5 = source("dutch", FILE).md5
    x, y, g, names = _encoded(str(path), md5)
    if opts.group_ratios is not None:
        index = ratio_index(g, opts.group_ratios, opts.seed, list(GROUP_NAMES))
        x, y, g = x[index], y[index], g[index]
    return holdout_dataset(
        "dutch", opts, x, y, g, class_names=CLASS_NAMES, group_names=GROUP_NAMES,
        meta={"feature_names": list(names), "n_rows_cleaned": int(len(y)), "sources": {FILE: md5}},
    )
