"""The feature transform of a table: one-hot categories, standardised numbers.

``TablePreprocessor`` is fit on the training split only and travels with the dataset
(``GroupedDataset.preprocessor``), the prepared files and the logged model, so prediction
applies exactly the transform the model was trained on. It takes raw rows (a DataFrame with the
feature columns, values as read from the file: numbers may still be strings) and returns
float32 arrays. It computes what scikit-learn's ``SimpleImputer`` (median, most frequent),
``StandardScaler`` and ``OneHotEncoder(handle_unknown="ignore")`` in a ``ColumnTransformer``
compute (a test holds it to them), from plain numbers: its fitted state is JSON
(:meth:`TablePreprocessor.to_json`, :meth:`TablePreprocessor.from_json`), which loads without
running any code, unlike a pickle.

Privacy: a transform fit on the training rows holds exact statistics of them (each numeric
column's mean and standard deviation, the categories seen and, with ``missing: impute``, the
medians and most frequent values). None of them is covered by a run's ε; whoever publishes a
model together with this transform publishes them too. Columns whose range or categories the
user declares (public knowledge, e.g. "age lies in [18, 100]") use no statistic of the data:
numbers are clipped to the range and mapped linearly onto [-1, 1] (missing: 0, the middle),
categories one-hot over the declared list (missing or unknown: all zeros).
``data_independent`` says every column was declared.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from dpfair.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

DECLARED = "declared ranges and categories only (no statistic of the data)"


def fitted_on(fitted: list[str]) -> str:
    return (f"training split for columns {', '.join(fitted)}: exact means, standard deviations "
            "and categories of the training rows (not covered by the reported epsilon)")


def scale_to_range(x: np.ndarray, low: list[float], high: list[float]) -> np.ndarray:
    """Clip each column to ``[low, high]`` and map it linearly onto [-1, 1] (NaN stays NaN)."""
    lo, hi = np.asarray(low, np.float64), np.asarray(high, np.float64)
    return (np.clip(np.asarray(x, np.float64), lo, hi) - lo) / (hi - lo) * 2.0 - 1.0


def numeric_problems(values: pd.Series) -> pd.Series:
    """The non-missing entries of ``values`` that are not finite numbers (empty when all are)."""
    import pandas as pd

    parsed = pd.to_numeric(values, errors="coerce")
    return values[(parsed.isna() | np.isinf(parsed.astype(np.float64))) & values.notna()]


def to_numbers(values: pd.Series) -> pd.Series:
    """``values`` as float64 (missing stays NaN); the caller checked ``numeric_problems``."""
    import pandas as pd

    return pd.to_numeric(values, errors="coerce").astype(np.float64)


def category_text(value: object) -> str:
    """One category value as text, as :func:`to_categories` writes a column's values: an
    integral float as an integer (``2.0`` -> ``"2"``), anything else ``str()``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def first_missing(frame: pd.DataFrame, columns: Iterable[str]) -> tuple[str, pd.Index] | None:
    """The first of ``columns`` that misses a value in ``frame``, with the rows (index labels)
    where it does; None when no value is missing."""
    for col in columns:
        rows = frame.index[frame[col].isna()]
        if len(rows):
            return col, rows
    return None


def to_categories(values: pd.Series) -> pd.Series:
    """``values`` as strings (integral floats written as integers), missing as NaN."""
    import pandas as pd

    if pd.api.types.is_float_dtype(values):
        present = values.dropna()
        if (present == present.round()).all():
            values = values.astype("Int64")
    return values.astype(object).map(lambda v: np.nan if pd.isna(v) else str(v)).astype(object)


class TablePreprocessor:
    """Numeric columns: (median imputation,) standardisation, or a declared range; categorical:
    (most frequent,) one-hot, or one-hot over declared categories; unknown categories give
    all zeros in :meth:`transform`. Output columns: fitted numeric, declared numeric, fitted
    categorical (one per level seen in training, sorted, a missing value's level ``nan`` last),
    declared categorical (one per declared value). :meth:`check_rows` holds rows to predict to
    the rules of training: with ``unknown="error"`` a category value the transform never saw
    is refused."""

    def __init__(self, numeric: list[str], categorical: list[str], *, impute: bool,
                 ranges: dict[str, list[float]] | None = None,
                 categories: dict[str, list[str]] | None = None,
                 unknown: str = "error") -> None:
        self.unknown = unknown
        self.numeric = list(numeric)
        self.categorical = list(categorical)
        self.impute = impute
        self.ranges = dict(ranges or {})
        self.categories = dict(categories or {})
        fitted = [c for c in self.numeric if c not in self.ranges]
        fitted += [c for c in self.categorical if c not in self.categories]
        self.data_independent = not fitted
        self.fitted_on = DECLARED if not fitted else fitted_on(fitted)
        self.state = FittedState()

    @property
    def columns(self) -> list[str]:
        """The raw feature columns the transform reads, in order."""
        return [*self.numeric, *self.categorical]

    def _groups(self) -> tuple[list[str], list[str], list[str], list[str]]:
        """(fitted numeric, declared numeric, fitted categorical, declared categorical)."""
        return ([c for c in self.numeric if c not in self.ranges],
                [c for c in self.numeric if c in self.ranges],
                [c for c in self.categorical if c not in self.categories],
                [c for c in self.categorical if c in self.categories])

    def _raw(self, frame: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise DataError(
                f"the rows to transform lack the feature columns {missing} "
                f"(expected columns: {self.columns})"
            )
        out = pd.DataFrame(index=frame.index)
        for col in self.numeric:
            bad = numeric_problems(frame[col])
            if len(bad):
                raise DataError(
                    f"column {col!r} is numeric but holds {list(bad.astype(str).unique()[:5])} "
                    f"(rows {', '.join(map(str, bad.index[:5].tolist()))}); give finite numbers "
                    "(or leave the value empty)"
                )
            out[col] = to_numbers(frame[col])
        for col in self.categorical:
            out[col] = to_categories(frame[col])
        return out

    def known_categories(self) -> dict[str, list[str]]:
        """Each categorical column's values the transform encodes (declared, or seen in the
        training split)."""
        known = {c: [str(v) for v in vs] for c, vs in self.categories.items()}
        known.update({c: [str(v) for v in levels if v is not None]
                      for c, levels in self.state.levels.items() if c not in self.categories})
        return known

    def check_rows(self, frame: pd.DataFrame) -> None:
        """Rows to predict, held to training's rules (a DataError naming column, value and
        row): numbers must be numbers, a missing value needs ``missing: impute``, and with
        ``unknown="error"`` every category value must be one the transform encodes."""
        raw = self._raw(frame)
        if not self.impute and (gap := first_missing(raw, self.columns)) is not None:
            col, rows = gap
            raise DataError(
                f"column {col!r} has no value in row(s) {', '.join(map(str, rows[:5].tolist()))}:"
                " the model was trained without missing values (the dataset's missing: impute "
                "would fill them); give a value")
        if self.unknown != "error":
            return
        for col, known in self.known_categories().items():
            values = raw[col]
            unseen = values[values.notna() & ~values.isin(known)]
            if len(unseen):
                raise DataError(
                    f"column {col!r} holds {unseen.iloc[0]!r} in row {unseen.index[0]}"
                    f"{f' (and {len(unseen) - 1} more rows)' if len(unseen) > 1 else ''}, a "
                    f"category the model never saw (it knows {', '.join(known)}). Fix: correct "
                    "the value, or declare the dataset's unknown: ignore to predict such rows "
                    "with that column's one-hot part all zeros")

    def fit(self, frame: pd.DataFrame) -> TablePreprocessor:
        """Learn each fitted column's statistics from the training rows ``frame``."""
        raw = self._raw(frame)
        num, _, cat, _ = self._groups()
        state = FittedState()
        for col in num:
            x = raw[col].to_numpy(np.float64)
            if self.impute:
                seen = x[~np.isnan(x)]
                state.median[col] = float(np.median(seen)) if len(seen) else 0.0
                x = np.where(np.isnan(x), state.median[col], x)
            state.mean[col], state.scale[col] = _mean_and_scale(x[~np.isnan(x)])
        for col in cat:
            values = raw[col]
            if self.impute:
                counts = values.dropna().value_counts()
                state.mode[col] = min(counts.index[counts == counts.max()]) if len(counts) else ""
                values = values.fillna(state.mode[col])
            levels = sorted(values.dropna().unique().tolist())
            state.levels[col] = [*levels, *([None] if values.isna().any() else [])]
        self.state = state
        return self

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """float32 array ``(n, d)`` of the raw rows ``frame`` (extra columns are ignored),
        held to training's rules first (:meth:`check_rows`: with ``unknown="error"`` a category
        the model never saw is a DataError, not a row of zeros)."""
        self.check_rows(frame)
        return self.encode(frame)

    def encode(self, frame: pd.DataFrame) -> np.ndarray:
        """:meth:`transform` without the checks: the dataset's own splits, whose held-out rows
        may hold a category the training rows lack (encoded as zeros, as ``unknown: ignore``
        would)."""
        raw = self._raw(frame)
        num, num_declared, cat, cat_declared = self._groups()
        if num and not self.state.mean:
            raise DataError("the transform was not fit: call fit(training rows) first")
        blocks = []
        for col in num:
            x = raw[col].to_numpy(np.float64)
            if self.impute:
                x = np.where(np.isnan(x), self.state.median[col], x)
            blocks.append(((x - self.state.mean[col]) / self.state.scale[col])[:, None])
        if num_declared:
            x = scale_to_range(raw[num_declared].to_numpy(np.float64),
                               [self.ranges[c][0] for c in num_declared],
                               [self.ranges[c][1] for c in num_declared])
            blocks.append(np.where(np.isnan(x), 0.0, x) if self.impute else x)
        for col in cat:
            values = raw[col].fillna(self.state.mode[col]) if self.impute else raw[col]
            blocks.append(_one_hot(values, self.state.levels[col]))
        blocks += [_one_hot(raw[col], self.categories[col]) for col in cat_declared]
        out = np.hstack(blocks) if blocks else np.zeros((len(raw), 0))
        return np.ascontiguousarray(out, dtype=np.float32)

    @property
    def feature_names(self) -> list[str]:
        """Names of the output columns (``col`` for numbers, ``col_value`` for categories)."""
        num, num_declared, cat, cat_declared = self._groups()
        levels = {**self.state.levels, **self.categories}
        return [*num, *num_declared, *(f"{c}_{'nan' if v is None else v}"
                                       for c in [*cat, *cat_declared] for v in levels[c])]

    def to_json(self) -> str:
        """The whole transform, settings and fitted statistics, as JSON (no code)."""
        return SavedTransform(
            numeric=self.numeric, categorical=self.categorical, impute=self.impute,
            ranges=self.ranges, categories=self.categories, unknown=self.unknown,
            fitted=self.state).model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "the saved transform") -> TablePreprocessor:
        """The transform :meth:`to_json` wrote; a DataError names ``where`` if it is not one."""
        from pydantic import ValidationError

        try:
            saved = SavedTransform.model_validate_json(text)
        except ValidationError as exc:
            raise DataError(f"{where} is not a dpfair table transform ({exc.error_count()} "
                            f"problem(s), first: {exc.errors()[0]['msg']}); prepare or log "
                            "it again with this dpfair") from None
        pre = cls(saved.numeric, saved.categorical, impute=saved.impute, ranges=saved.ranges,
                  categories=saved.categories, unknown=saved.unknown)
        num, _, cat, _ = pre._groups()
        need = {"mean": num, "scale": num, "levels": cat,
                **({"median": num, "mode": cat} if saved.impute else {})}
        for field, cols in need.items():
            if set(getattr(saved.fitted, field)) != set(cols):
                raise DataError(f"{where}: its fitted {field} does not cover the columns "
                                f"{cols}; prepare or log it again with this dpfair")
        pre.state = saved.fitted
        return pre


def _mean_and_scale(x: np.ndarray) -> tuple[float, float]:
    """``StandardScaler``'s mean and scale of one column: the population standard deviation,
    1 for a constant column (a variance within rounding of zero)."""
    if not len(x):
        return 0.0, 1.0
    mean, var, n = float(np.mean(x)), float(np.var(x)), len(x)
    eps = np.finfo(np.float64).eps
    constant = var <= n * eps * var + (n * mean * eps) ** 2
    scale = math.sqrt(var)
    return mean, 1.0 if constant or scale < 10 * eps else scale


def _one_hot(values: pd.Series, levels: list[str | None]) -> np.ndarray:
    """``(n, len(levels))`` indicators; a value not among ``levels`` gives zeros, a missing one
    the ``None`` level when there is one."""
    index = {v: i for i, v in enumerate(levels)}
    missing = index.get(None)
    out = np.zeros((len(values), len(levels)))
    for row, value in enumerate(values.tolist()):
        k = missing if not isinstance(value, str) else index.get(value)
        if k is not None:
            out[row, k] = 1.0
    return out


class FittedState(BaseModel):
    """What fitting learned from the training rows, per fitted column (plain numbers and
    strings): ``mean``/``scale`` (standardisation), ``median`` (imputation), ``mode`` (most
    frequent category), ``levels`` (the categories seen, sorted; None: missing)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mean: dict[str, float] = {}
    scale: dict[str, float] = {}
    median: dict[str, float] = {}
    mode: dict[str, str] = {}
    levels: dict[str, list[str | None]] = {}


class SavedTransform(BaseModel):
    """A :class:`TablePreprocessor` as JSON: its settings and :class:`FittedState`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal["dpfair.table_transform/1"] = "dpfair.table_transform/1"
    numeric: list[str]
    categorical: list[str]
    impute: bool
    ranges: dict[str, tuple[float, float]]
    categories: dict[str, list[str]]
    unknown: Literal["error", "ignore"] = "error"
    fitted: FittedState
