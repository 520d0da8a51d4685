"""The feature transform of a table: one-hot categories, standardised numbers (scikit-learn).

``TablePreprocessor`` wraps a ``ColumnTransformer`` fit on the training split only and travels
with the dataset (``GroupedDataset.preprocessor``) and the prepared files, so prediction applies
exactly the transform the model was trained on. It takes raw rows (a DataFrame with the feature
columns, values as read from the file: numbers may still be strings) and returns float32 arrays.

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

from typing import TYPE_CHECKING

import numpy as np

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
    all zeros in :meth:`transform`. :meth:`check_rows` holds rows to predict to the rules of
    training: with ``unknown="error"`` a category value the transform never saw is refused."""

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
        self._transformer = self._build()

    @property
    def columns(self) -> list[str]:
        """The raw feature columns the transform reads, in order."""
        return [*self.numeric, *self.categorical]

    def _build(self):  # -> ColumnTransformer (sklearn imported lazily)
        from sklearn.compose import ColumnTransformer
        from sklearn.impute import SimpleImputer
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler

        fit_num = [c for c in self.numeric if c not in self.ranges]
        fit_cat = [c for c in self.categorical if c not in self.categories]
        num_declared = [c for c in self.numeric if c in self.ranges]
        cat_declared = [c for c in self.categorical if c in self.categories]
        num, cat = [StandardScaler()], [OneHotEncoder(handle_unknown="ignore",
                                                      sparse_output=False)]
        declared = [FunctionTransformer(scale_to_range, feature_names_out="one-to-one", kw_args={
            "low": [self.ranges[c][0] for c in num_declared],
            "high": [self.ranges[c][1] for c in num_declared]})]
        if self.impute:
            num.insert(0, SimpleImputer(strategy="median"))
            cat.insert(0, SimpleImputer(strategy="most_frequent"))
            declared.append(SimpleImputer(strategy="constant", fill_value=0.0,
                                          keep_empty_features=True))
        parts = [
            ("numeric", make_pipeline(*num), fit_num),
            ("numeric_declared", make_pipeline(*declared), num_declared),
            ("categorical", make_pipeline(*cat), fit_cat),
            ("categorical_declared", OneHotEncoder(
                categories=[self.categories[c] for c in cat_declared], handle_unknown="ignore",
                sparse_output=False), cat_declared),
        ]
        return ColumnTransformer([p for p in parts if p[2]], remainder="drop",
                                 verbose_feature_names_out=False)

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
        known = dict(self.categories)
        if "categorical" in self._transformer.named_transformers_:
            fitted = [c for c in self.categorical if c not in self.categories]
            encoder = self._transformer.named_transformers_["categorical"][-1]
            known.update({c: [str(v) for v in cats]
                          for c, cats in zip(fitted, encoder.categories_, strict=True)})
        return known

    def check_rows(self, frame: pd.DataFrame) -> None:
        """Rows to predict, held to training's rules (a DataError naming column, value and
        row): numbers must be numbers, a missing value needs ``missing: impute``, and with
        ``unknown="error"`` every category value must be one the transform encodes."""
        raw = self._raw(frame)
        if not self.impute:
            for col in self.columns:
                rows = raw.index[raw[col].isna()]
                if len(rows):
                    raise DataError(
                        f"column {col!r} has no value in row(s) "
                        f"{', '.join(map(str, rows[:5].tolist()))}: the model was trained "
                        "without missing values (the dataset's missing: impute would fill them); "
                        "give a value")
        if getattr(self, "unknown", "error") != "error":
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
        self._transformer.fit(self._raw(frame))
        return self

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """float32 array ``(n, d)`` of the raw rows ``frame`` (extra columns are ignored)."""
        raw = self._raw(frame)
        if raw.empty:
            return np.zeros((0, len(self.feature_names)), dtype=np.float32)
        x = self._transformer.transform(raw)
        return np.ascontiguousarray(x, dtype=np.float32)

    @property
    def feature_names(self) -> list[str]:
        """Names of the output columns (``col`` for numbers, ``col_value`` for categories)."""
        return [str(n) for n in self._transformer.get_feature_names_out()]
