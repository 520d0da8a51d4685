"""``kind: table``: a user's CSV or Parquet file declared in params.yaml (pandas, pyarrow).

::

    datasets:
      loans:
        kind: table
        path: data/loans.csv          # relative to the working directory (the project root)
        target: default
        positive_label: "yes"
        protected: [sex, race]

The file is read, then ``tabular_frame.build_dataset`` does the rest. Its data version is the
md5 of its bytes, the hash ``dvc add data/loans.csv`` records in ``data/loans.csv.dvc``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from dpfair.data.privacy_unit import PrivacyUnit
from dpfair.data.registry import register_kind
from dpfair.data.tabular_frame import TableOptions, Where, build_dataset
from dpfair.data.version import file_version
from dpfair.errors import DataError, SourceMissingError, did_you_mean

if TYPE_CHECKING:
    import pandas as pd

    from dpfair.data.dataset import GroupedDataset, Inspect

_FORMATS = {".csv": "csv", ".tsv": "csv", ".txt": "csv", ".parquet": "parquet", ".pq": "parquet"}


class TableFileOptions(TableOptions):
    """Options of a ``kind: table`` dataset: the file, then the columns (``TableOptions``)."""

    kind: Literal["table"] = Field(description="a CSV or Parquet file")
    path: str = Field(min_length=1, description="the file (relative to the working directory)")
    format: Literal["auto", "csv", "parquet"] = Field(
        "auto", description="auto: from the suffix (.csv/.tsv/.txt or .parquet/.pq)")
    separator: str | None = Field(None, description="CSV field separator (default: a comma, a "
                                  "tab for .tsv)")
    id_column: str | None = Field(
        None, description="a column naming the person of each row (never a feature): the "
        "privacy ledger then recognises the same people across files, names and versions")
    privacy_unit: PrivacyUnit = Field(
        default_factory=PrivacyUnit, description="what one ε protects (a row, or a person "
        "by id_column) and whose account pays (dpfair.data.privacy_unit)")

    @model_validator(mode="after")
    def _person_needs_ids(self) -> TableFileOptions:
        if self.privacy_unit.unit == "person" and self.id_column is None:
            raise ValueError("privacy_unit: unit person needs id_column, the column naming the "
                             "person of each row; set it, or use unit: row")
        return self

    def column_roles(self) -> list[tuple[str, list[str]]]:
        """The columns' roles, the person id with the row ids (it may be one of them)."""
        roles = super().column_roles()
        if self.id_column is None:
            return roles
        return [*roles[:2], ("id_columns or id_column", [*self.id_columns, self.id_column])]


def source_path(opts: TableFileOptions) -> Path:
    """The file, which must exist (SourceMissingError naming where it was looked for)."""
    path = Path(opts.path).expanduser()
    if path.is_dir():
        raise DataError(f"the dataset's path {path} is a folder; give the CSV or Parquet file "
                        "in it")
    if not path.is_file():
        where = path if path.is_absolute() else f"{path} (relative to {Path.cwd()})"
        raise SourceMissingError(
            f"data file not found: {where}. Fix: set the dataset's path to an existing CSV or "
            "Parquet file; a DVC-tracked file may need `dvc pull`"
        )
    return path


def _format(path: Path, given: str) -> str:
    if given != "auto":
        return given
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"cannot tell the format of {path} from its suffix; name it .csv or "
                        ".parquet, or set the dataset's format: csv | parquet")
    return fmt


def _check_header(first: pd.DataFrame, path: Path) -> None:
    """pandas renames a repeated header ``y`` to ``y.1``: a duplicated target would become a
    feature (a label leak). Refuse a header that names a column twice."""
    names = [str(v) for v in (first.iloc[0].tolist() if len(first) else [])]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DataError(f"the header of {path} names the column(s) {', '.join(map(repr, twice))}"
                        " more than once; rename or remove the repeated columns")


def read_table(opts: TableFileOptions) -> tuple[pd.DataFrame, Where]:
    """The file's rows and where they came from (DataError if the file cannot be parsed)."""
    return read_rows(source_path(opts), opts.format, opts.separator)


def read_rows(path: Path, fmt: str = "auto", separator: str | None = None
              ) -> tuple[pd.DataFrame, Where]:
    """The rows of a CSV or Parquet file (format from the suffix unless given) and where they
    came from; a DataError names a file that cannot be read as its format."""
    import pandas as pd
    import pyarrow

    fmt = _format(path, fmt)
    try:
        if fmt == "csv":
            tab = path.suffix.lower() == ".tsv"
            sep = separator if separator is not None else ("\t" if tab else ",")
            _check_header(pd.read_csv(path, sep=sep, header=None, nrows=1), path)
            frame = pd.read_csv(path, sep=sep)
        else:
            frame = pd.read_parquet(path)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError,
            pyarrow.ArrowException) as exc:
        raise DataError(
            f"cannot read {path} as {fmt.upper()}: {type(exc).__name__}: {exc}. Fix: check that "
            f"the file is a valid {fmt.upper()} file (export it again, or set format)"
        ) from None
    if frame.empty:
        raise DataError(f"{path} holds no data rows; give a file with a header and rows")
    return frame, Where(str(path), first_line=2 if fmt == "csv" else None)


def table_version(opts: TableFileOptions) -> str:
    """md5 of the file's bytes (the hash DVC records for it)."""
    return file_version(source_path(opts))


@register_kind("table", TableFileOptions, "your CSV or Parquet file", version=table_version)
def load_table(name: str, opts: TableFileOptions, inspect: Inspect | None = None
               ) -> GroupedDataset:
    frame, where = read_table(opts)
    where = Where(where.source, f"datasets.{name}.", where.first_line)
    if opts.id_column is not None:
        if opts.id_column not in frame.columns:
            raise DataError(f"id column {opts.id_column!r} is not in {where.source}"
                            f"{did_you_mean(opts.id_column, [str(c) for c in frame.columns])}. "
                            f"Fix: set datasets.{name}.id_column to a column of the file")
        if opts.id_column not in opts.id_columns:  # never a feature; carried by predictions
            opts = opts.model_copy(update={"id_columns": [*opts.id_columns, opts.id_column]})
        _check_rows_per_person(frame, opts, name)
    ds = build_dataset(frame, opts, name=name, where=where, inspect=inspect)
    ds.meta["sources"] = {Path(opts.path).name: table_version(opts)}
    return ds


def _check_rows_per_person(frame: pd.DataFrame, opts: TableFileOptions, name: str) -> None:
    """Refuse a table where one person holds more rows than ``privacy_unit`` declares: every ε
    would promise less than it says. The message names no count (a statistic of the rows)."""
    unit = opts.privacy_unit
    if unit.unit != "person" or opts.id_column is None:
        return
    if int(frame[opts.id_column].value_counts(dropna=False).max()) > unit.rows:
        raise DataError(
            f"datasets.{name}: a person ({opts.id_column}) holds more rows than "
            f"privacy_unit.max_rows_per_person: {unit.rows}. Fix: raise max_rows_per_person to "
            "the most rows one person may hold (every ε is charged for that many), or keep "
            "at most that many rows per person in the file")
