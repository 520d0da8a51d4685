"""``dpfair data``: list the datasets, prepare one (a sub-app of :mod:`dpfair.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from dpfair.cli.console import ParamsOption, console, resolve_params
from dpfair.cli.error_boundary import cli_errors
from dpfair.errors import ConfigError, DpfairError

__all__ = ["data_app", "files_status", "prepare_and_show", "summary_table"]

data_app = typer.Typer(help="Datasets: list, prepare.", no_args_is_help=True)


def summary_table(summary: dict[str, Any]) -> Table:
    """Rows per split; per-class / per-group counts only when the summary holds them (opt-in)."""
    exact = "per_class" in summary and "per_group" in summary
    title = (f"{summary['dataset']}  (input shape {tuple(summary['input_shape'])}, "
             f"{summary['n_features']:,} features)")
    table = Table(title=title, min_width=len(title))  # the title on one line
    table.add_column("split")
    table.add_column("rows", justify="right")
    if exact:
        table.add_column("per class")
        table.add_column("per group")
    for split in ("train", "val", "test"):
        counts = [
            ", ".join(f"{k}: {v:,}" for k, v in summary[key][split].items())
            for key in ("per_class", "per_group")
        ] if exact else []
        table.add_row(split, f"{summary['rows'][split]:,}", *counts)
    table.add_row("total", f"{summary['rows']['total']:,}", *[""] * (2 if exact else 0),
                  style="bold")
    return table


def prepare_and_show(
    name: str, params: Any, out: Path, *, exact_counts: bool = False,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from dpfair.data.prepared import prepare

    options = options if options is not None else params.dataset(name)
    summary = prepare(name, options, out, exact_counts=exact_counts)
    console.print(summary_table(summary))
    console.print(f"classes: {', '.join(summary['class_names'])}")
    console.print(f"groups: {', '.join(summary['group_names'])}")
    console.print(f"summary.json: {summary['privacy']}")
    console.print(f"written to {out / name}")
    return summary


def files_status(name: str) -> str:
    """Whether the raw files of dataset ``name`` were found (in the mirror or the download
    cache, where ``dpfair.data.sources.fetch`` looks first), without reading or fetching them."""
    from dpfair.data.sources import _downloads_enabled, cache_dir, mirror_dir, sources_of

    if name == "celeba":
        from dpfair.data.celeba import CelebAOptions, find_root

        try:
            return f"found: {find_root(CelebAOptions())[0]}"
        except DpfairError:
            return "not found: set datasets.celeba.root"
    records = sources_of(name)
    if not records:
        return "-"
    roots = [root for root in (mirror_dir(), cache_dir()) if root is not None]
    if all(any((root / r.dirname / r.filename).is_file() for root in roots) for r in records):
        return "found"
    return ("not found: downloaded on first use" if _downloads_enabled()
            else "not found (DPFAIR_OFFLINE is set)")


@data_app.command("list")
@cli_errors
def data_list() -> None:
    """List the available datasets (and whether their raw files were found) and the kinds of
    file dataset that params.yaml can declare."""
    from dpfair.data.registry import kinds, specs

    table = Table(title="datasets")
    table.add_column("name")
    table.add_column("raw files")
    table.add_column("description")
    for name, spec in specs().items():
        table.add_row(name, files_status(name) if spec.needs_files else "none needed",
                      spec.summary)
    for kind, kind_spec in kinds().items():
        table.add_row(f"kind: {kind}", "yours", f"{kind_spec.summary} (declare it in params.yaml)")
    console.print(table)


@data_app.command("prepare")
@cli_errors
def data_prepare(
    name: Annotated[str, typer.Argument(
        help="dataset name (see `dpfair data list`, or declared in params.yaml), or a CSV or "
        "Parquet file with --target and --protected")],
    params: ParamsOption = None,
    target: Annotated[str | None, typer.Option(help="file: the label column")] = None,
    protected: Annotated[list[str] | None, typer.Option(
        help="file: a protected column (repeat for intersectional groups)")] = None,
    positive_label: Annotated[str | None, typer.Option(
        help="file: the target value that is class 1 (binary)")] = None,
    missing: Annotated[str, typer.Option(help="file: error | drop | impute")] = "error",
    out: Annotated[Path, typer.Option("--out", "-o", help="output root")] = Path(
        "data/prepared"
    ),
    exact_counts: Annotated[
        bool,
        typer.Option(
            "--exact-counts",
            help="also write and print exact per-class and per-group counts of every split "
            "(NOT private: the summary is marked so)",
        ),
    ] = False,
) -> None:
    """Preprocess dataset NAME with its options from params.yaml and write it under OUT/NAME.

    NAME may also be a CSV or Parquet file: `dpfair data prepare data/loans.csv --target
    default --protected sex --protected race` writes OUT/loans (declare it in params.yaml's
    datasets: section to train on it).
    """
    p = resolve_params(params)
    path = Path(name)
    if path.suffix.lower() in {".csv", ".tsv", ".parquet", ".pq"}:
        if target is None or not protected:
            raise ConfigError(f"preparing the file {name} needs --target COLUMN and "
                              "--protected COLUMN (repeat --protected for several)")
        options = {"kind": "table", "path": name, "target": target, "protected": protected,
                   "positive_label": positive_label, "missing": missing}
        prepare_and_show(path.stem, p, out, exact_counts=exact_counts, options=options)
        return
    if target is not None or protected or positive_label is not None or missing != "error":
        raise ConfigError(f"--target, --protected, --positive-label and --missing apply to a "
                          f"CSV or Parquet file; {name!r} is a dataset name: set its options in "
                          "params.yaml's datasets: section")
    prepare_and_show(name, p, out, exact_counts=exact_counts)

