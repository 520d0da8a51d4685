"""``dpfair`` command line (typer). One sub-app per area; new areas add a sub-app or a command.

    dpfair data list      dpfair data prepare NAME [--params params.yaml] [--out DIR]
    dpfair train --method M [--seed S]     dpfair tune --method M [--workers N]
    dpfair run        the experiment flow (Prefect), results in MLflow
    dpfair results    the comparison table of the latest pipeline run
    dpfair evaluate   DVC metrics and plot tables from a results table (dvc.yaml)
    dpfair predict --model NAME[/VERSION] --input rows.csv --output preds.csv
    dpfair serve      scheduled retraining when the data changes (Prefect deployment)

``@cli_errors`` (on every command; a test checks) is the one error boundary
(:mod:`dpfair.error_boundary`): an expected failure is one message naming the problem and the
fix, exit code 2; anything else is a bug, with its traceback and a request to report it.

``dpfair --help`` must stay fast: this module imports only typer, rich, ``dpfair.errors`` and
``dpfair.settings`` at import time; each command imports what it needs when it runs.

Output: accuracies in percent with one decimal (as the results tables), other scores to four
significant digits; lines are never hard-wrapped (``soft_wrap``: a printed command or ε line
stays one line to copy); no third-party progress bars (MLflow's artifact downloads).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from dpfair.error_boundary import cli_errors
from dpfair.errors import (
    ConfigError,
    DpfairError,
    format_validation_error,
)
from dpfair.settings import DEFAULT_PARAMS

if TYPE_CHECKING:
    from dpfair.config import Params

app = typer.Typer(
    name="dpfair",
    help="Differentially private training that removes DP's disparate impact on groups.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(help="Datasets: list, prepare.", no_args_is_help=True)
app.add_typer(data_app, name="data")

console = Console(soft_wrap=True)
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def percent(fraction: float) -> str:
    """An accuracy as every dpfair output shows it: percent with one decimal."""
    return f"{100.0 * fraction:.1f}%"


def score(value: float) -> str:
    """A score or loss: four significant digits."""
    return f"{value:.4g}"

ParamsOption = Annotated[Path | None, typer.Option(
    "--params", "-p",
    help=f"parameters file (default: ./{DEFAULT_PARAMS} if present, else built-in defaults)",
)]


def resolve_params(path: Path | None) -> Params:
    """Explicit path: must exist. No path: ./params.yaml when present, else the defaults."""
    from dpfair.config import Params, load_params

    if path is None:
        default = Path(DEFAULT_PARAMS)
        return load_params(default) if default.is_file() else Params()
    return load_params(path)


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
    name: str, params: Params, out: Path, *, exact_counts: bool = False,
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


MethodOption = Annotated[
    str, typer.Option("--method", "-m", help="method label of experiment.methods")
]


def _method_label(params: Params, label: str) -> str:
    labels = ["nonprivate", *params.experiment.methods]
    if label not in labels:
        raise ConfigError(f"unknown method {label!r} (experiment.methods has: {', '.join(labels)})")
    return label


def _group_table(title: str, names: list[str], metrics: dict[str, Any]) -> Table:
    table = Table(title=title)
    for col in ("group", "accuracy", "loss", "count"):
        table.add_column(col, justify="right" if col != "group" else "left")
    for k, name in enumerate(names):
        count = metrics.get("group_count")  # not released with noisy test metrics
        table.add_row(name, percent(metrics['group_accuracy'][k]),
                      score(metrics['group_loss'][k]),
                      f"{int(count[k])}" if count is not None else "—")
    return table


@app.command("train")
@cli_errors
def train_cmd(
    method: MethodOption = "dpsgd",
    seed: Annotated[int, typer.Option(min=0, help="seed of the initialisation (and, only "
                                           "when reproducible, of sampling and noise)")] = 0,
    params: ParamsOption = None,
) -> None:
    """Train one method of params.yaml's experiment on its dataset and print the results."""
    from dpfair.commands import train_standalone
    from dpfair.data import load_dataset
    from dpfair.release import HEURISTIC, NONPRIVATE_REFERENCE, TEST_METRICS_NOTE, epsilon_text
    from dpfair.tracking import ui_command
    from dpfair.training import REPLAYABLE_NOISE

    p = resolve_params(params)
    label = _method_label(p, method)
    dataset = load_dataset(p.experiment.dataset, p.dataset(p.experiment.dataset))
    result, record = train_standalone(p, label, seed, dataset)  # progress: params (auto)
    m = result.test_metrics
    console.print(_group_table(f"{label} on {dataset.name}, seed {seed}: test set",
                               dataset.group_names, m))
    macro = f"macro {percent(m['macro_accuracy'])}  " if "macro_accuracy" in m else ""
    console.print(f"accuracy {percent(m['accuracy'])}  {macro}"
                  f"worst group {percent(m['worst_group_accuracy'])}")
    run = f"{result.steps} steps, q={result.sample_rate:.4g}, sigma={result.sigma:.4g}"
    if result.privacy_guarantee == "proven":
        console.print(f"epsilon {epsilon_text(result.epsilon)} at delta {result.delta:g} ({run})")
    else:
        no_eps = NONPRIVATE_REFERENCE if result.privacy_guarantee == "none" else HEURISTIC
        console.print(f"epsilon: {no_eps} ({run}; privacy_guarantee: "
                      f"{result.privacy_guarantee})")
    if result.reproducible:
        console.print(f"[bold red]reproducible:[/] {REPLAYABLE_NOISE}")
    console.print(f"test metrics: {result.test_release.label}" if result.test_release.noisy
                  else TEST_METRICS_NOTE)
    console.print(f"MLflow run {record.run_id}, model {record.model_uri}; open the UI with:\n"
                  f"  {ui_command(p.tracking)}", soft_wrap=True)


@app.command("tune")
@cli_errors
def tune_cmd(
    method: MethodOption = "dpsgd",
    workers: Annotated[int | None, typer.Option(
        min=1, help="worker processes, at least 1 (default: params)")] = None,
    storage: Annotated[str | None, typer.Option(
        help="sqlite:///FILE, journal:PATH or postgresql://... (default: params)")] = None,
    study: Annotated[str | None, typer.Option(help="study name; the same name resumes")] = None,
    params: ParamsOption = None,
) -> None:
    """Private hyperparameter search for one method (tuning.spaces) with its epsilon.

    By default (tuning.release: selected) only what the search's epsilon covers is printed:
    the selected configuration and the epsilons. K and the trials' scores go to a private
    ledger file beside the Optuna storage; with tuning.release: all_trials they are printed
    too, and the search's epsilon is the composition of all K runs."""
    from dpfair.commands import tune_standalone
    from dpfair.data import load_dataset
    from dpfair.release import HEURISTIC
    from dpfair.training import REPLAYABLE_NOISE
    from dpfair.tuning.config import check_storage

    p = resolve_params(params)
    label = _method_label(p, method)
    if label not in p.tuning.spaces:
        raise ConfigError(f"tuning.spaces has no search space for {label!r}")
    overrides = {k: v for k, v in (("workers", workers), ("storage", storage)) if v is not None}
    cfg = p.tuning.config(label, study or f"{p.experiment.dataset}-{label}")
    try:
        cfg = cfg.model_validate({**cfg.model_dump(), **overrides})
    except ValidationError as exc:
        given = " ".join(f"--{k} {v!r}" for k, v in overrides.items())
        raise ConfigError(f"{given}: "
                          + format_validation_error(exc, type(cfg), prefix=("tuning",))) from None
    check_storage(cfg.storage or "sqlite:///optuna.db")  # before the data loads
    dataset = load_dataset(p.experiment.dataset, p.dataset(p.experiment.dataset))
    result, search, release, ledger = tune_standalone(p, label, cfg, dataset)
    mode = p.tuning.release
    console.print(f"selected ({cfg.score}, {cfg.mode} search): "
                  f"{result.best_params if result.best_params is not None else 'none'}")
    if not release.has_epsilon:
        console.print(f"epsilon: {HEURISTIC} (privacy_guarantee: {release.guarantee})")
    else:
        eps = release.epsilon_search if search.event else math.inf
        console.print(f"epsilon: one training run {result.epsilon_training:.3f}, whole search "
                      f"{eps:.3f} ({search.label}; delta {result.delta:g})")
    if mode == "all_trials":
        console.print(f"K = {result.K} runs, best {cfg.score} = {score(result.best_score)}; "
                      f"ledger (released): {ledger}")
    else:
        console.print(f"private ledger (K, every trial and score: not for release): {ledger}")
    if result.reproducible:
        console.print(f"[bold red]reproducible:[/] {REPLAYABLE_NOISE}")
    console.print(f"study {result.study_name!r} in {result.storage}")


@app.command("run")
@cli_errors
def run(
    params: ParamsOption = None,
    copy_results: Annotated[Path | None, typer.Option(
        help="also copy the results table and figures to this new, empty or dpfair-written "
        "folder (replaced; dvc.yaml's run stage); any other folder is refused")] = None,
    resume: Annotated[bool, typer.Option(
        help="resume the latest pipeline run of these settings and data if it failed or was "
        "killed (finished searches and trainings are read back, not redone); --no-resume "
        "starts a new run")] = True,
) -> None:
    """Run the experiment flow: prepare, tune, train every method x seed, report to MLflow."""
    from dpfair.checks import check_run
    from dpfair.config import load_params

    path = params or Path(DEFAULT_PARAMS)
    check_run(p := load_params(path))  # data, groups, model: an error before any server
    from dpfair.preflight import check_tracking
    check_tracking(p.tracking)
    from dpfair.owned_dir import check_replaceable, replace_with_copy
    from dpfair.tracking import ui_command
    from flows.experiment import run_experiment

    check_replaceable(copy_results)  # before anything runs: never delete others' files
    # DVC (the flow's prepare step) prints through its own handlers, not again through Prefect's
    logging.getLogger("dvc").propagate = False
    out = run_experiment(str(path), ".", resume=resume, checked=True)
    if copy_results is not None:
        replace_with_copy(out["results_dir"], copy_results)
    console.print(out["table"], markup=False, highlight=False)
    console.print(f"figures and tables: {out['results_dir']}")
    if registered := out.get("registered_model"):
        console.print(f"registered model: {registered['name']} version {registered['version']} "
                      f"(dpfair predict --model {registered['name']}/{registered['version']} "
                      "--input rows.csv --output preds.csv)", soft_wrap=True)
    console.print(f"MLflow parent run {out['parent_run_id']}; open the UI with:\n"
                  f"  {ui_command(p.tracking)}")


@app.command("results")
@cli_errors
def results(
    run_id: Annotated[str | None, typer.Option(help="pipeline run id (default: latest)")] = None,
    params: ParamsOption = None,
) -> None:
    """Print the comparison table of the latest (or a given) pipeline run from MLflow."""
    from dpfair.preflight import check_tracking
    from dpfair.tracking import read_results

    p = resolve_params(params)
    check_tracking(p.tracking)
    found_id, table = read_results(p.tracking, run_id)
    console.print(f"pipeline run {found_id}")
    console.print(table, markup=False, highlight=False)


@app.command("evaluate")
@cli_errors
def evaluate(
    results_csv: Annotated[Path, typer.Argument(help="results.csv of a pipeline run")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory")] = Path(
        "evaluation"),
) -> None:
    """Write DVC metrics and plot tables from a results table (dvc.yaml's evaluate stage)."""
    from dpfair.dvc_outputs import write_outputs

    for path in write_outputs(results_csv, out).values():
        console.print(f"wrote {path}")


@app.command("predict")
@cli_errors
def predict_cmd(
    model: Annotated[str, typer.Option(
        "--model", "-m", help="a registered model NAME (its latest version) or NAME/VERSION, "
        "an MLflow URI (models:/..., runs:/...) or a model folder")],
    rows: Annotated[Path, typer.Option(
        "--input", "-i", help="CSV of raw rows holding the model's input columns")],
    out: Annotated[Path, typer.Option(
        "--output", "-o", help="CSV to write: prediction and probability_<class> per row")],
    params: ParamsOption = None,
) -> None:
    """Predict with a logged or registered dpfair model (its preprocessing included)."""
    from dpfair.model_export import predict_csv

    p = resolve_params(params)
    n = predict_csv(p.tracking, model, rows, out)
    console.print(f"{n} predictions written to {out}", soft_wrap=True)


@app.command("audit")
@cli_errors
def audit_cmd(
    method: Annotated[str | None, typer.Option(
        "--method", "-m", help="label of experiment.methods (default: audit.method)")] = None,
    canaries: Annotated[int | None, typer.Option(min=1, help="canaries per group")] = None,
    kind: Annotated[str | None, typer.Option(help="mislabel | ood | gradient")] = None,
    beta: Annotated[float | None, typer.Option(help="the bound holds w.p. 1 - beta")] = None,
    group: Annotated[list[str] | None, typer.Option(
        "--group", "-g", help="group to audit (repeat; default: all)")] = None,
    sigma: Annotated[float | None, typer.Option(help="noise multiplier")] = None,
    target_epsilon: Annotated[float | None, typer.Option(help="replaces sigma")] = None,
    epochs: Annotated[int | None, typer.Option(min=1)] = None,
    track: Annotated[bool | None, typer.Option(
        "--track/--no-track", help="log the audit run to MLflow (default: audit.track)")] = None,
    params: ParamsOption = None,
) -> None:
    """Empirical privacy audit: train one method once with canaries (each included with
    probability 1/2) and print an epsilon lower bound per group next to the claimed epsilon
    (Steinke, Nasr & Jagielski 2023). A lower bound, not a proof of privacy."""
    from dpfair.audit import AuditSection
    from dpfair.audit_tracking import audit_from_params, claim_note, log_audit
    from dpfair.tracking import ui_command

    p = resolve_params(params)
    given = {"method": method, "canaries": canaries, "kind": kind, "beta": beta,
             "groups": group or None, "sigma": sigma, "target_epsilon": target_epsilon,
             "epochs": epochs, "track": track}
    overrides = {k: v for k, v in given.items() if v is not None}
    if "target_epsilon" in overrides:
        overrides.setdefault("sigma", None)
    elif "sigma" in overrides:
        overrides["target_epsilon"] = None
    try:
        section = AuditSection.model_validate({**p.audit.model_dump(), **overrides})
    except ValidationError as exc:
        raise ConfigError("command-line options: " + format_validation_error(
            exc, AuditSection, prefix=("audit",))) from None
    config, dataset, result = audit_from_params(p, section)
    table = Table(title=f"audit of {section.method} on {dataset.name}: {section.kind} "
                        f"canaries, confidence {result.confidence:.0%}")
    for col in ("group", "canaries", "included", "correct / guesses", "epsilon >=",
                "joint epsilon >=", "mu >=", "certifiable <=", "claimed epsilon"):
        table.add_column(col, justify="left" if col == "group" else "right")
    for g in result.groups:
        claimed = "—" if g.epsilon_claimed is None else f"{g.epsilon_claimed:.3f}"
        table.add_row(g.group, str(g.canaries), str(g.included), f"{g.correct} / {g.guesses}",
                      f"{g.epsilon_lower_bound:.3f}", f"{g.joint_lower_bound:.3f}",
                      f"{g.mu_lower_bound:.3f}", f"{g.max_certifiable:.2f}", claimed)
    console.print(table)
    console.print("\n".join(result.statement()))
    console.print(f"claim: {claim_note(result)} (delta {result.delta:g}); an empirical lower "
                  "bound: above the claim shows a bug, below it proves nothing")
    if section.track:
        run_id = log_audit(p.tracking, section.method, config, dataset, result)
        console.print(f"MLflow audit run {run_id}; open the UI with:\n  {ui_command(p.tracking)}")


@app.command("serve")
@cli_errors
def serve(
    params: ParamsOption = None,
    root: Annotated[str, typer.Option(
        help="project folder of each scheduled run, --params being relative to it (the "
             "deployment's parameters; a relative root is resolved where this command runs)")
    ] = ".",
) -> None:
    """Serve the scheduled retraining (params.yaml's cron) as a Prefect deployment: each run
    retrains when the data version changed since the last release, else skips."""
    from flows.schedule import serve_experiment

    serve_experiment(str(params or DEFAULT_PARAMS), root)


if __name__ == "__main__":  # python -m dpfair.cli
    app()
