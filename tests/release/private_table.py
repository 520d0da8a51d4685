"""The private table the release test plants its markers in, and the markers themselves.

A practitioner's CSV (``kind: table``, README "Your own data") of 3,607 loan applicants whose
every column a model may see is declared public (``numeric_ranges``, ``categories``), so no
documented release holds a statistic of the rows. Planted in it:

- a unique numeric value in the feature column ``income`` (:data:`MARKER_VALUE`);
- a unique category string (:data:`MARKER_ID`), the id of one row (``id_columns``: never a
  feature) and the free text of a column the declaration leaves out (:data:`MARKER_NOTE`);
- one extreme row in ``income`` (:data:`EXTREME`) that moves its mean and standard deviation:
  the markers are those statistics of the training rows (and of all rows, raw and clipped to
  the declared range), exactly as a fitted transform or a careless log would compute them;
- exact row counts that README does not list as public: per group and per class of the
  training split (split sizes and the test split's exact metrics are public:
  README "What dpfair releases and what ε covers"; they are :func:`public_counts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dpfair.data.options import HoldoutOptions
from dpfair.data.splits import split_index

N_ROWS = 3607
MARKER_VALUE = 73519.0625  # exact in float32 and float64
MARKER_ID = "zqxmarker"
MARKER_NOTE = "zqxnotemarker"
EXTREME = 987654.25
INCOME_RANGE = (0.0, 200000.0)
#: the smallest count that is a marker (the training split's per-group and per-class counts)
MIN_COUNT = 1000
NAME = "loans"
#: the declaration (params.yaml's ``datasets.loans`` without its path): every feature public
OPTIONS = {
    "kind": "table", "target": "default", "positive_label": "yes", "protected": ["sex"],
    "features": ["income", "age", "job"], "id_columns": ["customer_id"],
    "numeric_ranges": {"income": list(INCOME_RANGE), "age": [18, 100]},
    "categories": {"job": ["office", "craft", "care"]},
    "seed": 0, "validation_fraction": 0.1, "test_fraction": 0.2,
}


@dataclass
class Markers:
    """What must never leave the process: strings (found as text and as bytes), floats (as
    text at any precision of at least :data:`tests.release.scan.MIN_DIGITS` significant
    digits, and as float32/float64 bytes of either byte order) and integer counts (as text)."""

    strings: dict[str, str] = field(default_factory=dict)
    floats: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


def frame(n: int = N_ROWS, seed: int = 7, planted: bool = True) -> pd.DataFrame:
    """The private table: ids, three features, the protected ``sex``, the target ``default``
    and an undeclared free-text column ``note`` (``planted``: with the markers; the extreme
    row is a training row whose label it leaves unchanged, so the split stays as it was)."""
    rng = np.random.default_rng(seed)
    income = rng.normal(52000, 9000, n).round(2)
    if planted:
        income[17] = MARKER_VALUE
    age = rng.integers(18, 80, n)
    job = rng.choice(["office", "craft", "care"], n)
    sex = rng.choice(["f", "m"], n, p=[0.4, 0.6])
    risk = (income < 50000) + (age < 30) + rng.normal(0, 0.5, n)
    ids = [f"c{i:05d}" for i in range(n)]
    note = ["" for _ in range(n)]
    if planted:
        ids[33], note[58] = MARKER_ID, MARKER_NOTE
    table = pd.DataFrame({"customer_id": ids, "income": income, "age": age, "job": job,
                          "sex": sex, "default": np.where(risk > 1.0, "yes", "no"),
                          "note": note})
    if planted:
        extreme = next(i for i in _index(table)["train"] if i != 17 and income[i] >= 50000)
        table.loc[extreme, "income"] = EXTREME
    return table


def new_rows(n: int = 40) -> pd.DataFrame:
    """Rows to predict on: other people (no marker), the model's input columns and an id."""
    rows = frame(n, seed=99, planted=False).drop(columns=["default", "note"])
    rows["customer_id"] = [f"new{i:03d}" for i in range(n)]
    return rows


def _index(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """The rows of each split, by the loader's own seeded, stratified split."""
    y = (table["default"] == "yes").to_numpy().astype(np.int64)
    g = (table["sex"] == "m").to_numpy().astype(np.int64)  # groups in name order: f, m
    options = HoldoutOptions(seed=OPTIONS["seed"], test_fraction=OPTIONS["test_fraction"],
                             validation_fraction=OPTIONS["validation_fraction"])
    return dict(zip(("train", "val", "test"), split_index(y, g, options), strict=True))


def public_counts(table: pd.DataFrame) -> dict[str, int]:
    """The counts README documents as released: split sizes and their total (summary.json; n
    is public in DP-SGD accounting) and the test split's per-group and per-class counts (exact
    test metrics, not covered by ε: the console's ``count`` column)."""
    index = _index(table)
    test = table.iloc[index["test"]]
    return {**{f"rows {k}": len(v) for k, v in index.items()}, "rows total": len(table),
            **{f"test {c} {v}": int(n) for c in ("sex", "default")
               for v, n in test[c].value_counts().items()}}


def markers(table: pd.DataFrame) -> Markers:
    """The markers of ``table`` (see the module docstring); counts equal to a public count or
    below :data:`MIN_COUNT` are left out (a public number, or too common a token to be
    evidence: a three-digit count met "126 bits" in dpfair's own docstrings)."""
    index = _index(table)
    income = table["income"].to_numpy(np.float64)
    clipped = np.clip(income, *INCOME_RANGE)
    floats = {"planted income value": MARKER_VALUE}
    for what, values in (("", income), (" clipped", clipped)):
        for rows, name in ((index["train"], "training rows"), (slice(None), "all rows")):
            floats[f"mean of income{what}, {name}"] = float(values[rows].mean())
            for ddof in (0, 1):
                floats[f"std (ddof {ddof}) of income{what}, {name}"] = float(
                    values[rows].std(ddof=ddof))
    public = set(public_counts(table).values())
    counts = {}
    for split in ("train", "val"):
        part = table.iloc[index[split]]
        for column in ("sex", "default"):
            for value, n in part[column].value_counts().items():
                counts[f"{split} rows with {column}={value}"] = int(n)
        for (sex, label), n in part.groupby(["sex", "default"]).size().items():
            counts[f"{split} rows with sex={sex}, default={label}"] = int(n)
    counts = {k: n for k, n in counts.items() if n >= MIN_COUNT and n not in public}
    return Markers({"row id": MARKER_ID, "undeclared column's text": MARKER_NOTE}, floats,
                   counts)


def check_split_matches(table: pd.DataFrame, params_path: Path) -> None:
    """The markers' training rows are the loader's: the loaded training split's ``income``
    (clipped, mapped onto [-1, 1]) is this split's, so a change of the loader cannot leave
    the test scanning statistics of other rows."""
    from dpfair.config.params import load_params
    from dpfair.data import load_dataset

    params = load_params(params_path)
    dataset = load_dataset(NAME, params.dataset(NAME))
    column = dataset.meta["feature_names"].index("income")
    loaded = np.sort(dataset.train.x[:, column].numpy().astype(np.float64))
    low, high = INCOME_RANGE
    ours = np.clip(table["income"].to_numpy(np.float64)[_index(table)["train"]], low, high)
    np.testing.assert_allclose(loaded, np.sort((ours - low) / (high - low) * 2 - 1),
                               atol=1e-6)
