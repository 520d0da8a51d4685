"""A user's table (a pandas DataFrame) as a GroupedDataset: labels, groups, splits, features.

``dataset_from_frame(frame, target=..., protected=[...])`` is the Python entry point; the
``kind: table`` loader (``table_file.py``) reads a CSV or Parquet file and calls the same
``build_dataset``. Steps, each with a clear DataError naming the source, the column and the fix:

1. columns: the target, the protected columns and the features (default: every other column)
   must exist; a feature is numeric when its dtype is, or when listed in ``numeric``, and
   categorical otherwise or when listed in ``categorical``;
2. missing values (``missing``): ``error`` refuses them, ``drop`` drops the rows holding one,
   ``impute`` fills features (median / most frequent, fit on the training split) and drops rows
   without a target or a protected value (neither can be imputed);
3. labels: the target's values (sorted), or binary with ``positive_label``; at least two classes;
4. groups: one per combination of the protected columns' values, named ``"female × black"``;
5. seeded train/validation/test splits stratified by group and label (scikit-learn's
   ``train_test_split``; strata with a single row are pooled, and if the test fraction is too
   small for one row per stratum the split is random); every group needs
   ``min_group_train_rows`` training rows and every class seen in validation or test must be
   in training;
6. features: ``TablePreprocessor`` (one-hot, standardisation) fit on the training split only,
   attached as ``dataset.preprocessor``; columns with declared ``numeric_ranges`` or
   ``categories`` use those instead of any statistic of the data (see ``preprocess.py``).
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, ValidationError, field_validator, model_validator

from dpfair.data.checks import check_values
from dpfair.data.dataset import DatasetPreview, GroupedDataset, Inspect
from dpfair.data.options import HoldoutOptions
from dpfair.data.preprocess import (
    TablePreprocessor,
    category_text,
    first_missing,
    numeric_problems,
    to_categories,
)
from dpfair.data.splits import make_split, split_index
from dpfair.errors import ConfigError, DataError, did_you_mean, format_validation_error

if TYPE_CHECKING:
    import pandas as pd

GROUP_SEPARATOR = " × "
CODED_MAX_VALUES = 10  # an undeclared integer column with 3..this many values gets a warning
_SHOWN = 5
#: the words that YAML 1.1 (PyYAML) reads as booleans when unquoted
_YAML_BOOLEANS = frozenset({"yes", "no", "on", "off", "true", "false"})
_LOOKS_NUMERIC = 0.8  # an object column with this share of numbers holds typos, not categories
#: a date (ISO 2024-01-31, 31.01.2024, 1/31/24), with an optional time after it
_DATE = r"(\d{4}-\d{1,2}-\d{1,2}|\d{1,2}[./]\d{1,2}[./]\d{2,4})([ T]\d{1,2}:\d{2}.*)?"


class TableOptions(HoldoutOptions):
    """Which columns are what, and how missing values and small groups are treated."""

    target: str = Field(description="label column (binary or multi-class)")
    protected: list[str] = Field(min_length=1, description="group columns (several: their "
                                 "combinations are the groups)")
    positive_label: str | int | float | bool | None = Field(
        None, description="binary target: this value is class 1, every other value class 0")
    features: list[str] | None = Field(None, description="feature columns (default: all others "
                                       "but the id columns)")
    id_columns: list[str] = Field(default_factory=list, description="row identifiers: never "
                                  "features; prediction copies them into its output")
    categorical: list[str] = Field(default_factory=list, description="force these categorical")
    numeric: list[str] = Field(default_factory=list, description="force these numeric")
    missing: Literal["error", "drop", "impute"] = Field(
        "error", description="missing values: refuse, drop the rows, or impute the features")
    min_group_train_rows: int = Field(10, ge=1, description="fewest training rows of any group")
    numeric_ranges: dict[str, list[float]] = Field(
        default_factory=dict, description="public [low, high] of numeric columns: scaled "
        "without any statistic of the data (values outside are clipped)")
    categories: dict[str, list[str]] = Field(
        default_factory=dict, description="public category lists: one-hot without looking at "
        "the data (a value outside the list is an error); values of the column's own type "
        "(integer codes stay integers)")
    unknown: Literal["error", "ignore"] = Field(
        "error", description="prediction on a category value the model never saw: an error "
        "naming column, value and row, or ignore (its one-hot part is all zeros)")

    @field_validator("categories", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        """Declared values compare as the column's values do (:func:`category_text`)."""
        if isinstance(value, dict):
            return {col: [category_text(v) for v in values] if isinstance(values, list)
                    else values for col, values in value.items()}
        return value

    @field_validator("numeric_ranges")
    @classmethod
    def _ranges(cls, value: dict[str, list[float]]) -> dict[str, list[float]]:
        for col, bounds in value.items():
            if len(bounds) != 2 or not bounds[0] < bounds[1]:
                raise ValueError(f"{col}: give [low, high] with low < high (got {bounds})")
        return value

    @field_validator("protected", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        return list(value) if isinstance(value, tuple) else value

    def column_roles(self) -> list[tuple[str, list[str]]]:
        """The options that give columns a role, each with its columns; no column may have
        two of these roles (a subclass with another role adds it)."""
        return [("target", [self.target]), ("protected", self.protected),
                ("id_columns", self.id_columns)]

    @model_validator(mode="after")
    def _one_role_per_column(self) -> TableOptions:
        """A column is the label, a group column or a row id, never two of these: a target
        that is also protected makes the groups the labels; an id that is the target or a
        group column would be dropped from what it is meant to be."""
        seen: dict[str, str] = {}
        for option, columns in self.column_roles():
            for col in dict.fromkeys(columns):
                if col in seen and seen[col] != option:
                    raise ValueError(
                        f"the column {col!r} is both {seen[col]} and {option}; a column has "
                        f"one role: give {option} another column or remove it there")
                seen.setdefault(col, option)
        return self


@dataclass(frozen=True)
class Where:
    """Where the rows come from, for messages: the source, the options' key prefix, and the
    first line of data in a text file (None: rows are named by their index)."""

    source: str
    setting: str = ""
    first_line: int | None = None

    def key(self, option: str) -> str:
        return f"{self.setting}{option}" if self.setting else f"the {option!r} argument"

    def rows(self, index: Any) -> str:
        idx = list(index)
        shown = [str(int(i) + self.first_line) if self.first_line is not None else str(i)
                 for i in idx[:_SHOWN]]
        more = f" and {len(idx) - _SHOWN} more" if len(idx) > _SHOWN else ""
        return f"{'lines' if self.first_line is not None else 'rows'} {', '.join(shown)}{more}"


def _columns(frame: pd.DataFrame, opts: TableOptions, where: Where) -> list[str]:
    present = [str(c) for c in frame.columns]
    asked = [("target", [opts.target]), ("protected", opts.protected),
             ("features", opts.features or []), ("id_columns", opts.id_columns),
             ("categorical", opts.categorical),
             ("numeric", opts.numeric), ("numeric_ranges", list(opts.numeric_ranges)),
             ("categories", list(opts.categories))]
    for option, names in asked:
        for col in names:
            if col not in present:
                raise DataError(
                    f"column {col!r} ({option}) is not in {where.source}"
                    f"{did_you_mean(col, present)}; its columns are: {', '.join(present)}. "
                    f"Fix: set {where.key(option)} to columns of the file"
                )
    both = {*opts.categorical, *opts.categories} & {*opts.numeric, *opts.numeric_ranges}
    if both:
        raise DataError(f"columns {sorted(both)} are listed both categorical and numeric; "
                        f"remove them from {where.key('categorical')} or {where.key('numeric')}")
    if opts.features is not None:
        for col, what in ((opts.target, "target"), *((c, "id column") for c in opts.id_columns)):
            if col in opts.features:
                raise DataError(f"the {what} {col!r} is also listed in {where.key('features')}; "
                                "remove it (a model may not see its label or row ids)")
        return list(opts.features)
    return [c for c in present if c not in {opts.target, *opts.protected, *opts.id_columns}]


def _missing(frame: pd.DataFrame, opts: TableOptions, where: Where) -> pd.DataFrame:
    labels = [opts.target, *opts.protected]
    if opts.missing == "error":
        if (gap := first_missing(frame, frame.columns)) is not None:
            col, rows = gap
            raise DataError(
                f"column {col!r} of {where.source} has missing values ({where.rows(rows)}) "
                f"and {where.key('missing')} is 'error'. Fix: fill them in, or set "
                f"{where.key('missing')} to 'drop' (drop those rows) or 'impute'"
            )
        return frame
    check = list(frame.columns) if opts.missing == "drop" else labels
    kept = frame.dropna(subset=check)
    if kept.empty:
        raise DataError(f"no row of {where.source} is left after dropping the rows with missing "
                        f"values in {check}; fill them in or set {where.key('missing')}: impute")
    return kept


def _feature_types(frame: pd.DataFrame, features: list[str], opts: TableOptions,
                   where: Where) -> tuple[list[str], list[str]]:
    import pandas as pd

    numeric, categorical = [], []
    for col in features:
        values = frame[col]
        if col not in {*opts.categorical, *opts.categories, *opts.numeric}:
            _refuse_dates(values, col, where)
        if col in opts.categories:
            _check_declared(values, opts.categories[col], col, where)
        if col in {*opts.categorical, *opts.categories} or pd.api.types.is_bool_dtype(values):
            categorical.append(col)
            continue
        if col not in {*opts.numeric, *opts.numeric_ranges}:
            _warn_if_coded(values, col, where)
        if col not in {*opts.numeric, *opts.numeric_ranges} and \
                not pd.api.types.is_numeric_dtype(values):
            present = int(values.notna().sum())
            numbers = present - len(numeric_problems(values))
            if not present or numbers < _LOOKS_NUMERIC * present:  # text: categories
                categorical.append(col)
                continue
        bad = numeric_problems(values)
        if len(bad):
            shown = ", ".join(repr(v) for v in bad.astype(str).unique()[:_SHOWN])
            raise DataError(
                f"column {col!r} of {where.source} is numeric but holds non-numeric or infinite "
                f"values {shown} ({where.rows(bad.index)}). Fix: correct those values (or leave "
                f"them empty and set {where.key('missing')}: drop or impute), or declare the "
                f"column categorical ({where.key('categorical')}: [{col}])"
            )
        numeric.append(col)
    return numeric, categorical


def _refuse_dates(values: pd.Series, col: str, where: Where) -> None:
    """A date or time column is no feature: as categories every day is its own, and nothing
    says which number of it matters. Refused with the fix (leave it out, or derive numbers)."""
    import pandas as pd

    present = values.dropna()
    if pd.api.types.is_datetime64_any_dtype(values):
        dates = present
    elif pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values):
        text = present.astype(str).str.strip()
        dates = text[text.str.fullmatch(_DATE)]
        if not len(present) or len(dates) < _LOOKS_NUMERIC * len(present):
            return
    else:
        return
    if len(dates):
        shown = ", ".join(repr(str(v)) for v in dates.unique()[:3])
        raise DataError(
            f"column {col!r} of {where.source} holds dates or times ({shown}): dpfair trains on "
            "numbers and categories, and a date is neither (as a category every day is its "
            f"own). Fix: leave it out of the features (list the others in "
            f"{where.key('features')}), or derive numbers from it (a duration in days, the "
            "month) in a column of their own")


def _warn_if_coded(values: pd.Series, col: str, where: Where) -> None:
    """One warning for an undeclared integer column with few distinct values: often codes of
    categories (1 = single, 2 = married, ...), which a model would read as amounts."""
    import pandas as pd

    if not pd.api.types.is_integer_dtype(values) or pd.api.types.is_bool_dtype(values):
        return
    distinct = values.nunique(dropna=True)
    if 2 < distinct <= CODED_MAX_VALUES:
        warnings.warn(
            f"column {col!r} of {where.source} holds integers with only {distinct} distinct "
            "values and is treated as a number. If they are codes of categories, declare "
            f"{where.key('categorical')}: [{col}] (or their list under "
            f"{where.key('categories')}.{col}); if they are amounts, declare "
            f"{where.key('numeric')}: [{col}] to silence this warning",
            UserWarning, stacklevel=2)


def _check_declared(values: pd.Series, declared: list[str], col: str, where: Where) -> None:
    values = to_categories(values)
    other = values[values.notna() & ~values.isin(declared)]
    if len(other):
        shown = ", ".join(repr(v) for v in other.unique()[:_SHOWN])
        words = sorted(v for v in values.dropna().unique() if str(v).lower() in _YAML_BOOLEANS)
        fix = (f"YAML reads unquoted {', '.join(words)} as booleans: quote them: {words}"
               if words and {"True", "False"} & set(declared) else
               f"add them to {where.key('categories')}.{col}, or correct those values")
        raise DataError(
            f"column {col!r} of {where.source} holds {shown} ({where.rows(other.index)}), not "
            f"among its declared categories {declared}. Fix: {fix}"
        )


def _natural(values: list[str]) -> list[str]:
    try:
        return sorted(values, key=float)
    except ValueError:
        return sorted(values)


def _labels(target: pd.Series, opts: TableOptions, where: Where) -> tuple[np.ndarray, list[str]]:
    import pandas as pd

    present = target.dropna()
    if pd.api.types.is_float_dtype(present) and not (present == present.round()).all():
        raise DataError(
            f"the target column {opts.target!r} of {where.source} holds fractional numbers: "
            "dpfair trains classifiers, and a continuous target would make every value a "
            f"class. Fix: set {where.key('target')} to a categorical column (or bin the values)")
    values = to_categories(target)
    seen = _natural(list(values.unique()))
    if opts.positive_label is not None:
        pos = str(opts.positive_label)
        if pos not in seen:
            raise DataError(
                f"{where.key('positive_label')} {pos!r} is not a value of the target column "
                f"{opts.target!r} in {where.source} (values: {', '.join(seen[:10])}). Fix: give "
                "one of them (in params.yaml quote it: \"yes\" is a string, yes is a boolean)"
            )
        others = [v for v in seen if v != pos]
        class_names = [others[0] if len(others) == 1 else f"not {pos}", pos]
        y = (values == pos).to_numpy(np.int64)
    else:
        class_names = seen
        y = values.map({v: i for i, v in enumerate(seen)}).to_numpy(np.int64)
    if len(seen) < 2:
        raise DataError(
            f"the target column {opts.target!r} of {where.source} has a single class "
            f"({seen[0]!r}) in the rows used: a classifier needs at least two. Fix: choose "
            f"another {where.key('target')} or add rows of the other classes"
        )
    return y, class_names


def target_values(target: pd.Series, class_names: list[str]) -> list[Any] | None:
    """Each class as the target column holds it (``1`` rather than ``"1"``: predictions then
    compare equal to the column), or None when a class is no single value of the column (``"not
    yes"``) or the values are text anyway."""
    import pandas as pd

    if pd.api.types.is_object_dtype(target) or pd.api.types.is_string_dtype(target):
        return None
    present = target.dropna()
    first = dict(zip(to_categories(present), present.tolist(), strict=True))
    if not all(name in first for name in class_names):
        return None
    return [first[name].item() if hasattr(first[name], "item") else first[name]
            for name in class_names]


def _groups(protected: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    parts = [to_categories(protected[c]) for c in protected.columns]
    keys = list(zip(*(p.tolist() for p in parts), strict=True))
    order = sorted(set(keys), key=lambda k: [(_natural([v]), v) for v in k])
    code = {k: i for i, k in enumerate(order)}
    return np.array([code[k] for k in keys], np.int64), [GROUP_SEPARATOR.join(k) for k in order]


def shown(values: list[str]) -> str:
    """The first few of ``values`` quoted, and how many more (a message stays readable)."""
    more = f" and {len(values) - _SHOWN} more" if len(values) > _SHOWN else ""
    return ", ".join(repr(v) for v in values[:_SHOWN]) + more


def check_splits(y: np.ndarray, g: np.ndarray, index: dict[str, np.ndarray],
                 class_names: list[str], group_names: list[str], *, min_rows: int,
                 groups_from: str, target: str, where: Where) -> None:
    """Every group has ``min_rows`` training rows; no class is in val or test but not train.

    The message says "fewer than" and never the count (an exact count of a training group).
    """
    counts = np.bincount(g[index["train"]], minlength=len(group_names))
    small = [group_names[k] for k in np.flatnonzero(counts < min_rows)]
    if small:
        plural = len(small) > 1
        raise DataError(
            f"group{'s' if plural else ''} {shown(small)} of "
            f"{where.source} ({groups_from}) {'have' if plural else 'has'} fewer than "
            f"{min_rows} training rows ({where.key('min_group_train_rows')}). Fix: add rows, "
            f"merge rare groups, or lower {where.key('min_group_train_rows')}"
        )
    trained = set(np.unique(y[index["train"]]).tolist())
    for split in ("val", "test"):
        unseen = sorted(set(np.unique(y[index[split]]).tolist()) - trained)
        if unseen:
            names = shown([class_names[c] for c in unseen])
            raise DataError(
                f"the {split} split of {where.source} holds the label {names} of "
                f"{target}, never seen in the training split: the class has too "
                "few rows. Fix: add rows of that class, merge it with another, or drop its rows"
            )


def _people(frame: pd.DataFrame, opts: TableOptions) -> pd.Series | None:
    """The person of each row when the privacy unit is a person (a ``kind: table`` dataset's
    ``privacy_unit``), else None: the splits are then made of whole people."""
    unit, ids = getattr(opts, "privacy_unit", None), getattr(opts, "id_column", None)
    if unit is None or unit.unit != "person" or ids is None:
        return None
    return frame[ids].astype("string").fillna("")


def build_dataset(frame: pd.DataFrame, opts: TableOptions, *, name: str, where: Where,
                  inspect: Inspect | None = None) -> GroupedDataset:
    """The GroupedDataset of ``frame`` (steps in the module docstring); ``inspect`` sees its
    preview once the groups are known, before the split."""
    frame = frame.rename(columns=str)
    if frame.columns.duplicated().any():  # a repeated target would become a feature
        twice = sorted(set(frame.columns[frame.columns.duplicated()]))
        raise DataError(f"{where.source} has the column(s) {', '.join(map(repr, twice))} more "
                        "than once; rename or remove the repeated columns")
    features = _columns(frame, opts, where)
    used = list(dict.fromkeys([opts.target, *opts.protected, *features]))
    owners = _people(frame, opts)
    frame = _missing(frame[used], opts, where)
    if len(frame) < 2 * opts.min_group_train_rows:
        raise DataError(
            f"{where.source} has {len(frame)} usable row(s): too few for two groups of "
            f"{opts.min_group_train_rows} training rows ({where.key('min_group_train_rows')})."
            " Fix: give more rows")
    numeric, categorical = _feature_types(frame, features, opts, where)
    y, class_names = _labels(frame[opts.target], opts, where)
    class_values = target_values(frame[opts.target], class_names)
    g, group_names = _groups(frame[opts.protected])
    if len(group_names) < 2:
        raise DataError(
            f"the protected column(s) {', '.join(opts.protected)} of {where.source} hold a "
            f"single value ({group_names[0]!r}) in the rows used: there are no groups to "
            f"compare. Fix: set {where.key('protected')} to column(s) with two or more values")

    def transform() -> TablePreprocessor:
        return TablePreprocessor(numeric, categorical, impute=opts.missing == "impute",
                                 ranges=opts.numeric_ranges, categories=opts.categories,
                                 unknown=opts.unknown)

    if inspect is not None:  # the width fitted on every row: never released, only a shape
        width = len(transform().fit(frame).feature_names)
        inspect(DatasetPreview(name, group_names, class_names, (width,)))
    people = None if owners is None else owners.loc[frame.index].to_numpy(dtype=str)
    index = dict(zip(("train", "val", "test"), split_index(y, g, opts, people), strict=True))
    check_splits(y, g, index, class_names, group_names, min_rows=opts.min_group_train_rows,
                 groups_from=f"columns {', '.join(opts.protected)}",
                 target=f"the target column {opts.target!r}", where=where)
    pre = transform().fit(frame.iloc[index["train"]])
    splits = {key: make_split(pre.encode(frame.iloc[idx]), y[idx], g[idx])
              for key, idx in index.items()}
    return GroupedDataset(
        name=name, **splits, class_names=class_names, group_names=group_names,
        meta={
            "options": opts.model_dump(mode="json"),
            "source": where.source,
            "feature_names": pre.feature_names,
            "columns": {"numeric": numeric, "categorical": categorical},
            "preprocessing": f"one-hot and scaling from the {pre.fitted_on}",
            "class_values": class_values,
            "id_columns": list(opts.id_columns),
            "protected": list(opts.protected),
        },
        preprocessor=pre,
    )


def frame_version(frame: pd.DataFrame) -> str:
    """md5 of a DataFrame's content (values, index and column names)."""
    import pandas as pd

    h = hashlib.md5(repr(list(frame.columns)).encode())
    h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return h.hexdigest()


def dataset_from_frame(frame: pd.DataFrame, *, target: str, protected: str | list[str],
                       features: list[str] | None = None, name: str = "frame",
                       **options: Any) -> GroupedDataset:
    """A GroupedDataset from a DataFrame: ``options`` are those of ``TableOptions`` (seed,
    validation_fraction, test_fraction, positive_label, categorical, numeric, missing,
    min_group_train_rows). A ConfigError for bad options, a DataError for bad data."""
    try:
        opts = TableOptions.model_validate(
            {"target": target, "protected": protected, "features": features, **options})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, TableOptions)) from None
    ds = build_dataset(frame, opts, name=name, where=Where(f"the DataFrame {name!r}"))
    ds.meta["data_version"] = frame_version(frame)
    return check_values(ds, f"the DataFrame {name!r}",
                        "every numeric feature must be a finite number")
