"""The ``dpfair`` commands on a model and on a run's results: ``evaluate`` (DVC metrics and
plot tables), ``predict`` (a logged or registered model on raw rows) and ``promote`` (a
registered version becomes the @champion). :mod:`dpfair.cli.commands` registers them; like
every command they import what they need when they run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpfair.cli.console import ParamsOption, checking, console, resolve_params
from dpfair.cli.error_boundary import cli_errors


@cli_errors
def evaluate(
    results_csv: Annotated[Path, typer.Argument(help="results.csv of a pipeline run")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory")] = Path(
        "evaluation"),
) -> None:
    """Write DVC metrics and plot tables from a results table (dvc.yaml's evaluate stage)."""
    from dpfair.owned_dir import check_not_an_input
    from dpfair.pipeline.dvc_outputs import write_outputs

    check_not_an_input(out, "--out", {"results": results_csv})
    for path in write_outputs(results_csv, out).values():
        console.print(f"wrote {path}")


@cli_errors
def predict_cmd(
    model: Annotated[str, typer.Option(
        "--model", "-m", help="a registered model NAME (its @champion), NAME@ALIAS or "
        "NAME/VERSION, an MLflow URI (models:/..., runs:/...) or a model folder")],
    rows: Annotated[Path, typer.Option(
        "--input", "-i", help="CSV of raw rows holding the model's input columns")],
    out: Annotated[Path, typer.Option(
        "--output", "-o", help="CSV to write: prediction and probability_<class> per row")],
    trust_model: Annotated[bool, typer.Option(
        "--trust-model", help="load a model folder that only its pickle (python_model.pkl) can "
        "load, which can run any code: only for a folder whose writers you trust")] = False,
    params: ParamsOption = None,
) -> None:
    """Predict with a logged or registered dpfair model (its preprocessing included)."""
    from dpfair.data.table_file import read_rows

    with checking():  # the file, then its rows against the model's rules, before its network
        from dpfair.owned_dir import check_not_an_input

        check_not_an_input(out, "--output", {"--input": rows})
        p = resolve_params(params)
        frame, _ = read_rows(rows)  # a file that is no table is refused before MLflow loads
        from dpfair.tracking.model_load import checked_rows, from_store, write_predictions

        location, frame = checked_rows(p.tracking, model, frame, rows)
    n = write_predictions(location, frame, out, trust_model or from_store(model))
    console.print(f"{n} predictions written to {out}", soft_wrap=True)


@cli_errors
def promote_cmd(
    name: Annotated[str, typer.Argument(help="registered model name, e.g. dpfair-digits")],
    version: Annotated[str | None, typer.Argument(
        help="the version to serve (default: the @challenger)")] = None,
    params: ParamsOption = None,
) -> None:
    """Make a registered version the @champion (what `dpfair predict --model NAME` serves),
    whatever the registry's criterion says."""
    from dpfair.tracking.model_registry import promote

    p = resolve_params(params)
    number = promote(p.tracking, name, version)
    console.print(f"{name} version {number} is now @champion")
