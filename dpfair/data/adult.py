"""UCI Adult, preprocessed as Esipova et al. 2023, App. B.1 (and Xu et al. 2021, Sec. 6.1).

* concat ``adult.data`` and ``adult.test`` (48,842 rows; the test file's first line is a comment),
  strip whitespace, drop every row with a ``?`` -> 45,222 rows (30,527 male / 14,695 female);
* drop ``fnlwgt``; strip the trailing ``.`` of the test labels; label 1 = income ``>50K``;
* race -> binary (0 white, 1 non-white), sex -> binary (0 male, 1 female): both stay features
  as one 0/1 column each, as in the papers' code (fair-dp), which gives 5 numerical + 2 binary
  + 91 one-hot = 98 input features, matching Esipova's MLP with N = 91,650 parameters;
* z-score the 5 numerical features (mean and sample std, ddof=1) over the **whole cleaned table**
  (all 45,222 rows, before balancing and splitting), as the papers and fair-dp do. The test
  rows therefore contribute to the normalisation statistics, exactly as in the papers
  (``numeric_scaling: minmax`` maps them to [0, 1] over the same rows, as Xu et al. Sec. 6.1);
* one-hot the 6 categorical features; columns ordered by feature then sorted value, so the
  column order is the same on every run;
* ``balance_groups``: sample ``samples_per_group`` rows per protected group without replacement
  (seeded). The paper samples each row with a probability giving 14,000 per sex *on average*;
  here the count is exact;
* or ``group_ratios`` (with ``balance_groups: false``): subsample the groups to relative sizes
  before the split, as the released code's ``group_ratios`` (``[1, 1]``: every woman and as
  many men, 14,695 each; see ``GroupRatioOptions``);
* seeded 80/20 train/test split (``test_fraction``), validation carved from the train part.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, model_validator

from dpfair.data.dataset import GroupedDataset
from dpfair.data.options import GroupRatioOptions
from dpfair.data.registry import register
from dpfair.data.sources import fetch, source
from dpfair.data.splits import holdout_dataset, ratio_index, rng
from dpfair.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
]
NUMERICAL = ["age", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
CATEGORICAL = [
    "workclass", "education", "marital-status", "occupation", "relationship", "native-country",
]
CLASS_NAMES = ["<=50K", ">50K"]
GROUP_NAMES = {"sex": ["male", "female"], "race": ["white", "non-white"]}


class AdultOptions(GroupRatioOptions):
    """Options of ``adult`` (defaults: Esipova App. B.1; Xu uses ``balance_groups: false``)."""

    protected: Literal["sex", "race"] = Field("sex", description="group attribute")
    numeric_scaling: Literal["minmax"] | None = Field(
        None, description="minmax: numeric features to [0, 1] (Xu Sec. 6.1); unset: z-score",
    )
    balance_groups: bool = Field(True, description="sample samples_per_group rows per group")
    samples_per_group: int = Field(14000, gt=0, description="rows per group when balancing")

    @model_validator(mode="after")
    def _one_sampling(self) -> AdultOptions:
        if self.group_ratios is not None and self.balance_groups:
            raise ValueError(
                "group_ratios and balance_groups both subsample the groups: set "
                "balance_groups: false to use group_ratios"
            )
        return self


def read_table(data_path: Path, test_path: Path) -> pd.DataFrame:
    """The cleaned table: both files, whitespace stripped, rows with '?' dropped, no fnlwgt."""
    import pandas as pd
    frames = []
    for path, skip in ((data_path, 0), (test_path, 1)):
        frame = pd.read_csv(
            path, header=None, names=COLUMNS, skiprows=skip, dtype=str,
            keep_default_na=False, skip_blank_lines=True,
        )
        frames.append(frame)
    df = pd.concat(frames, ignore_index=True)
    df = df.apply(lambda col: col.str.strip())
    df = df[(df != "").all(axis=1)]  # trailing blank lines
    if len(df) != 48842:
        raise DataError(
            f"adult: expected 48,842 raw rows in {data_path} + {test_path}, got {len(df)}"
        )
    df = df[~(df == "?").any(axis=1)].drop(columns="fnlwgt").reset_index(drop=True)
    df["income"] = df["income"].str.rstrip(".")
    return df


@lru_cache(maxsize=2)
def _encoded(
    data_path: str, test_path: str, md5s: tuple[str, str], scaling: str | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], tuple[str, ...]]:
    """Encoded features of the whole table; cached in-process (md5s make the key content-based).

    ``scaling``: ``None`` z-scores the numeric features, ``"minmax"`` maps each to [0, 1]
    (min and max over the whole cleaned table)."""
    import pandas as pd

    df = read_table(Path(data_path), Path(test_path))
    num = df[NUMERICAL].astype(np.float64)
    if scaling == "minmax":
        num = (num - num.min()) / (num.max() - num.min())
    else:
        num = (num - num.mean()) / num.std(ddof=1)
    parts = [num.to_numpy()]
    names = list(NUMERICAL)
    race = (df["race"] != "White").to_numpy(np.float64)
    sex = (df["sex"] == "Female").to_numpy(np.float64)
    parts += [race[:, None], sex[:, None]]
    names += ["race=non-white", "sex=female"]
    for col in CATEGORICAL:
        values = sorted(df[col].unique())
        codes = pd.Categorical(df[col], categories=values).codes
        parts.append(np.eye(len(values))[codes])
        names += [f"{col}={v}" for v in values]
    x = np.concatenate(parts, axis=1).astype(np.float32)
    y = (df["income"] == ">50K").to_numpy(np.int64)
    unknown = set(df["income"]) - set(CLASS_NAMES)
    if unknown:
        raise DataError(f"adult: unexpected income labels {sorted(unknown)}")
    groups = {"sex": sex.astype(np.int64), "race": race.astype(np.int64)}
    for arr in (x, y, *groups.values()):
        arr.flags.writeable = False
    return x, y, groups, tuple(names)


def balanced_index(g: np.ndarray, per_group: int, seed: int, names: list[str]) -> np.ndarray:
    """Exactly ``per_group`` rows of every group, without replacement, in table order."""
    gen = rng(seed, stream=3)
    keep = []
    for k, name in enumerate(names):
        rows = np.flatnonzero(g == k)
        if len(rows) < per_group:
            raise DataError(
                f"cannot balance: group {name!r} has {len(rows)} rows, fewer than "
                f"samples_per_group={per_group}"
            )
        keep.append(gen.choice(rows, size=per_group, replace=False))
    return np.sort(np.concatenate(keep))


@register("adult", AdultOptions, "UCI Adult income, group sex (or race)", needs_files=True)
def load_adult(opts: AdultOptions) -> GroupedDataset:
    files = ("adult.data", "adult.test")
    paths = tuple(fetch("adult", f) for f in files)  # md5-verified
    md5s = tuple(source("adult", f).md5 for f in files)
    x, y, groups, names = _encoded(str(paths[0]), str(paths[1]), md5s, opts.numeric_scaling)
    g = groups[opts.protected]
    group_names = GROUP_NAMES[opts.protected]
    index = np.arange(len(y))
    if opts.balance_groups:
        index = balanced_index(g, opts.samples_per_group, opts.seed, group_names)
    elif opts.group_ratios is not None:
        index = ratio_index(g, opts.group_ratios, opts.seed, group_names)
    return holdout_dataset(
        "adult", opts, x[index], y[index], g[index],
        class_names=CLASS_NAMES, group_names=group_names,
        meta={
            "feature_names": list(names),
            "n_rows_cleaned": int(len(y)),
            "sources": {p.name: m for p, m in zip(paths, md5s, strict=True)},
            "normalisation": (
                "min-max to [0, 1] over the whole cleaned table (Xu Sec. 6.1)"
                if opts.numeric_scaling == "minmax"
                else "z-score over the whole cleaned table (Esipova App. B.1, fair-dp)"
            ),
        },
    )
