"""``dpfair`` command line (typer). One sub-app per area; new areas add a sub-app or a command.

    dpfair data list      dpfair data prepare NAME [--params params.yaml] [--out DIR]
    dpfair train --method M [--seed S]     dpfair tune --method M [--workers N]
    dpfair run        the experiment flow (Prefect), results in MLflow
    dpfair results    the comparison table of the latest pipeline run
    dpfair evaluate   DVC metrics and plot tables from a results table (dvc.yaml)
    dpfair predict --model NAME[@ALIAS|/VERSION] --input rows.csv --output preds.csv
    dpfair promote NAME [VERSION]   make a registered version the @champion
    dpfair serve      scheduled retraining when the data changes (Prefect deployment)

``@cli_errors`` (on every command; a test checks) is the one error boundary
(:mod:`dpfair.cli.error_boundary`): an expected failure is one message naming the problem and the
fix, with its exit code (2 bad input, 3 budget refused, 4 unreachable); anything else is a bug
(exit code 1), with its traceback and a request to report it. ``dpfair audit`` exits 5 when it
prints a VIOLATION.

Global options: ``--version``; ``-q`` (no log lines: results and errors only); ``-v`` (MLflow's
and Prefect's INFO lines too; by default they show from WARNING up).

``dpfair --help`` must stay fast: this module imports only typer, rich, ``dpfair.errors``,
``dpfair.settings`` and the CLI's own modules (:mod:`dpfair.cli.console`, :mod:`dpfair.cli.data`)
at import time; each command imports what it needs when it runs.

Output: accuracies in percent with one decimal (as the results tables), other scores to four
significant digits; lines are never hard-wrapped (``soft_wrap``: a printed command or ε line
stays one line to copy); no third-party progress bars (MLflow's artifact downloads).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from dpfair.cli.console import (
    ParamsOption,
    checking,
    console,
    library_levels,
    percent,
    print_fitting,
    print_registered,
    resolve_params,
    score,
    set_verbosity,
    show_version,
)
from dpfair.cli.data import data_app, files_status
from dpfair.cli.error_boundary import EXIT_VIOLATION, cli_errors, user_errors_once
from dpfair.cli.model_commands import evaluate, predict_cmd, promote_cmd
from dpfair.errors import ConfigError, format_validation_error
from dpfair.settings import DEFAULT_PARAMS, quiet

if TYPE_CHECKING:
    from dpfair.config.params import Params
    from dpfair.data import GroupedDataset
    from dpfair.data.dataset import Inspect
    from dpfair.tuning.config import TuningConfig

__all__ = ["app", "files_status", "percent", "score"]

app = typer.Typer(
    name="dpfair",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

app.add_typer(data_app, name="data")


@app.callback()
def main(
    show_version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=show_version, help="print the version and exit"
    )] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="no log lines: only results and errors")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="also MLflow's and Prefect's INFO log lines")] = False,
) -> None:
    """Differentially private training that removes DP's disparate impact on groups.

    Exit codes: 0 done, 1 a bug in dpfair, 2 bad input (configuration, data, paths), 3 a
    privacy budget refused the release (nothing ran), 4 a service or folder is unreachable,
    5 `dpfair audit` found a VIOLATION."""
    set_verbosity(quiet, verbose)


MethodOption = Annotated[
    str, typer.Option("--method", "-m", help="method label of experiment.methods")
]


def _method_label(params: Params, label: str) -> str:
    labels = ["nonprivate", *params.experiment.methods]
    if label not in labels:
        raise ConfigError(f"unknown method {label!r} (experiment.methods has: {', '.join(labels)})")
    return label


def _model_check(params: Params, label: str, seed: int) -> Inspect:
    """The model of ``label`` checked on the dataset's preview, before the rows are split."""
    from dpfair.pipeline.check_step import check_trainable

    config = params.experiment.train_config(label, seed)
    return lambda preview: check_trainable(config, preview)


def _nproc_override(p: Params, label: str, seed: int, nproc: int | None) -> dict[str, int]:
    """``--nproc`` as an override of ``experiment.train.nproc`` for method ``label``, checked."""
    if nproc is None:
        return {}
    try:
        p.experiment.train_config(label, seed, nproc=nproc)
    except ValidationError as exc:
        from dpfair.training import TrainConfig

        found = format_validation_error(exc, TrainConfig, ("experiment", "train"))
        raise ConfigError(f"--nproc {nproc}: {found}") from None
    return {"nproc": nproc}


@app.command("train")
@cli_errors
def train_cmd(
    method: MethodOption = "dpsgd",
    seed: Annotated[int, typer.Option(min=0, help="seed of the initialisation (and, only "
                                           "when reproducible, of sampling and noise)")] = 0,
    register: Annotated[bool, typer.Option(
        "--register", help="also register the model as a version of the dataset's registered "
        "model (@challenger; @champion by pipeline.registry.criterion)")] = False,
    nproc: Annotated[int | None, typer.Option(
        min=1, help="processes that train the model together (torch.distributed: gloo on the "
        "CPU, nccl on GPUs; default: experiment.train.nproc)")] = None,
    params: ParamsOption = None,
) -> None:
    """Train one method of params.yaml's experiment on its dataset and print the results.
    Its run is named "standalone"; only pipeline runs register models, unless --register."""
    with checking():
        from dpfair.data import load_dataset

        p = resolve_params(params)
        label = _method_label(p, method)
        overrides = _nproc_override(p, label, seed, nproc)
        dataset = load_dataset(p.experiment.dataset, p.dataset(p.experiment.dataset),
                               inspect=_model_check(p, label, seed))
    # what the run needs (the gate, the accounting, MLflow) loads once the checks passed
    from dpfair import accounting
    from dpfair.cli.results import group_table
    from dpfair.pipeline.standalone import train_standalone
    from dpfair.release.labels import HEURISTIC, NONPRIVATE_REFERENCE, TEST_METRICS_NOTE
    from dpfair.release.plan import epsilon_text
    from dpfair.tracking.runs import ui_hint
    from dpfair.training import REPLAYABLE_NOISE

    result, record = train_standalone(p, label, seed, dataset, **overrides)  # progress: auto
    m = result.test_metrics
    console.print(group_table(f"{label} on {dataset.name}, seed {seed}: test set",
                               dataset.group_names, m))
    macro = f"macro {percent(m['macro_accuracy'])}  " if "macro_accuracy" in m else ""
    console.print(f"accuracy {percent(m['accuracy'])}  {macro}"
                  f"worst group {percent(m['worst_group_accuracy'])}")
    run = f"{result.steps} steps, q={result.sample_rate:.4g}, sigma={result.sigma:.4g}"
    if result.privacy_guarantee == "proven":
        console.print(f"epsilon {epsilon_text(result.epsilon)} at delta {result.delta:g}, "
                      f"protecting {p.privacy_unit()[0]} "
                      f"({accounting.spend(result.event, result.delta).accountant}; {run})")
    else:
        no_eps = NONPRIVATE_REFERENCE if result.privacy_guarantee == "none" else HEURISTIC
        console.print(f"epsilon: {no_eps} ({run}; privacy_guarantee: "
                      f"{result.privacy_guarantee})")
    if result.reproducible:
        console.print(f"[bold red]reproducible:[/] {REPLAYABLE_NOISE}")
    console.print(f"test metrics: {result.test_release.label}" if result.test_release.noisy
                  else TEST_METRICS_NOTE)
    console.print(f"MLflow run {record.run_id}, model {record.model_uri}", soft_wrap=True)
    if register:
        from dpfair.pipeline.summary import register_standalone

        print_registered(register_standalone(p, dataset, result, record))
    console.print(ui_hint(p.tracking), soft_wrap=True)


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
    with checking():
        p, label, cfg, dataset = _search_checked(params, method, workers, storage, study)
    # what the search needs (the gate, the accounting, Optuna, MLflow) loads once checked
    from dpfair.pipeline.standalone import tune_standalone
    from dpfair.release.labels import HEURISTIC
    from dpfair.training import REPLAYABLE_NOISE

    result, search, release, ledger = tune_standalone(p, label, cfg, dataset)
    mode = p.tuning.release
    console.print(f"selected ({cfg.score}, {cfg.mode} search): "
                  f"{result.best_params if result.best_params is not None else 'none'}")
    if not release.has_epsilon:
        console.print(f"epsilon: {HEURISTIC} (privacy_guarantee: {release.guarantee})")
    else:
        eps = release.epsilon_search if search.event else math.inf
        console.print(f"epsilon: one training run {release.epsilon_run:.3f} "
                      f"({release.accountant_run}), whole search {eps:.3f} ({search.label}; "
                      f"{release.accountant_search}; delta {result.delta:g}), protecting "
                      f"{p.privacy_unit()[0]}")
    if mode == "all_trials":
        console.print(f"K = {result.K} runs, best {cfg.score} = {score(result.best_score)}; "
                      f"ledger (released): {ledger}")
    else:
        console.print(f"private ledger (K, every trial and score: not for release): {ledger}")
    if result.reproducible:
        console.print(f"[bold red]reproducible:[/] {REPLAYABLE_NOISE}")
    console.print(f"study {result.study_name!r} in {result.storage}")


def _search_checked(params: Path | None, method: str, workers: int | None,
                    storage: str | None, study: str | None
                    ) -> tuple[Params, str, TuningConfig, GroupedDataset]:
    """``dpfair tune``'s checks, then its data: ``(params, label, tuning config, dataset)``."""
    from dpfair.data import load_dataset
    from dpfair.pipeline.preflight import check_storage_server
    from dpfair.tuning.config import PARAMS_STORAGE, check_storage

    p = resolve_params(params)
    label = _method_label(p, method)
    if label not in p.tuning.spaces:
        raise ConfigError(f"tuning.spaces has no search space for {label!r}")
    overrides = {k: v for k, v in (("workers", workers), ("storage", storage)) if v is not None}
    cfg = p.tuning.config(label, study or f"{p.experiment.dataset}-{label}")
    try:
        cfg = cfg.model_validate({**cfg.model_dump(), **overrides})
    except ValidationError as exc:
        from dpfair.urls import mask_url

        given = " ".join(f"--{k} {mask_url(str(v))!r}" for k, v in overrides.items())
        raise ConfigError(f"{given}: "
                          + format_validation_error(exc, type(cfg), prefix=("tuning",))) from None
    check_storage(cfg.storage or PARAMS_STORAGE)  # before the data loads
    check_storage_server(cfg.storage or PARAMS_STORAGE)
    dataset = load_dataset(p.experiment.dataset, p.dataset(p.experiment.dataset),
                           inspect=_model_check(p, label, p.experiment.seeds[0]))
    return p, label, cfg, dataset


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
    path = params or Path(DEFAULT_PARAMS)
    with checking():
        from dpfair.config.params import load_params

        p = load_params(path)  # a typo: refused before the checks' imports
        from dpfair.owned_dir import check_replaceable, replace_with_copy

        check_replaceable(copy_results)  # before anything runs: never delete others' files
        from dpfair.pipeline.check_step import check_run

        dataset = check_run(p)  # data, groups, model: before any server or tracking library
        from dpfair.pipeline.release_step import check_release

        check_release(p, dataset)  # over budget: refused in seconds (outputs/ kept: dvc.yaml)
        from dpfair.pipeline.preflight import check_storage_server, check_tracking
        check_tracking(p.tracking)
        for label in p.tuning.spaces:  # every search's storage (one, unless overridden)
            check_storage_server(p.tuning.config(label, label).storage)
    from dpfair.cli.results import print_results
    from dpfair.tracking.runs import remote, ui_command
    from flows.experiment import run_experiment

    library_levels()  # Optuna's, which its import set to INFO

    # DVC (the flow's prepare step) prints through its own handlers, not again through Prefect's
    logging.getLogger("dvc").propagate = False
    user_errors_once()  # a user error inside the flow: printed once, by @cli_errors
    out = run_experiment(str(path), ".", resume=resume, checked=True)
    if copy_results is not None:
        replace_with_copy(out["results_dir"], copy_results)
    results_dir = Path(out["results_dir"])
    print_results(results_dir, f"{p.experiment.dataset}: pipeline run {out['parent_run_id']}"
                   f"; every ε protects {p.privacy_unit()[0]}")
    if quiet():  # -q: the table and errors only
        return
    print_fitting("full table, notes and figures (results.md):", str(results_dir))
    if registered := out.get("registered_model"):
        print_registered(registered)
    if remote(p.tracking):
        print_fitting("the run in MLflow:", out["tracking_url"])
    else:
        print_fitting("serve MLflow's UI:", ui_command(p.tracking))
        print_fitting("then open the run:", out["tracking_url"])


@app.command("results")
@cli_errors
def results(
    run_id: Annotated[str | None, typer.Option(help="pipeline run id (default: latest)")] = None,
    dataset: Annotated[str | None, typer.Option(
        help="the dataset whose latest run to show (default: experiment.dataset)")] = None,
    full: Annotated[bool, typer.Option(
        "--full", help="the full table and its notes (markdown, wide) instead")] = False,
    params: ParamsOption = None,
) -> None:
    """Print the comparison table of the dataset's latest (or a given) pipeline run."""
    import tempfile

    from dpfair.cli.results import print_results
    from dpfair.pipeline.preflight import check_tracking
    from dpfair.tracking.runs import client, read_results

    p = resolve_params(params)
    check_tracking(p.tracking)
    name = None if run_id else dataset or p.experiment.dataset
    found_id, table = read_results(p.tracking, run_id, name)
    title = f"pipeline run {found_id}" + (f" of dataset {name}" if name else "")
    if full:
        console.print(title)
        console.print(table, markup=False, highlight=False)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = client(p.tracking).download_artifacts(found_id, "results", tmp)
        print_results(Path(folder), title)
    if not quiet():
        console.print("full table and notes: dpfair results --full")


# the commands on a model or a run's results (their own module: this one holds the runs)
app.command("evaluate")(evaluate)
app.command("predict")(predict_cmd)
app.command("promote")(promote_cmd)


@app.command("audit")
@cli_errors
def audit_cmd(
    method: Annotated[str | None, typer.Option(
        "--method", "-m", help="label of experiment.methods (default: audit.method)")] = None,
    canaries: Annotated[int | None, typer.Option(min=1, help="canaries per group")] = None,
    kind: Annotated[str | None, typer.Option(help="auto | mislabel | ood | gradient")] = None,
    beta: Annotated[float | None, typer.Option(help="the bound holds w.p. 1 - beta")] = None,
    leak: Annotated[float | None, typer.Option(
        help="leak over the claimed epsilon (nats) to catch w.p. audit.power (default 1)")
    ] = None,
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
    (Steinke, Nasr & Jagielski 2023) and a verdict per group and jointly; exit code 5 on a
    VIOLATION. A lower bound, not a proof of privacy."""
    from dpfair.audit import AuditSection
    from dpfair.pipeline.audit_run import audit_from_params, audited, claim_note, log_audit

    given = {"method": method, "canaries": canaries, "kind": kind, "beta": beta, "leak": leak,
             "groups": group or None, "sigma": sigma, "target_epsilon": target_epsilon,
             "epochs": epochs, "track": track}
    overrides = {k: v for k, v in given.items() if v is not None}
    if "target_epsilon" in overrides:
        overrides.setdefault("sigma", None)
    elif "sigma" in overrides:
        overrides["target_epsilon"] = None
    with checking():
        p = resolve_params(params)
        try:
            section = AuditSection.model_validate({**p.audit.model_dump(), **overrides})
        except ValidationError as exc:
            raise ConfigError("command-line options: " + format_validation_error(
                exc, AuditSection, prefix=("audit",))) from None
        config, dataset = audited(p, section)
    result = audit_from_params(p, section, config, dataset)
    from dpfair.audit.run import percent as whole_percent  # after the checks: loads scipy
    table = Table(title=f"audit of {section.method} on {dataset.name}: {result.plan.kind} "
                        f"canaries, confidence {result.confidence:.0%}")
    for col in ("group", "canaries", "included", "correct / guesses", "epsilon >=",
                "joint epsilon >=", "mu >=", "certifiable <=", "claimed epsilon",
                "power alone / jointly"):
        table.add_column(col, justify="left" if col == "group" else "right")
    for g in result.groups:
        claimed = "—" if g.epsilon_claimed is None else f"{g.epsilon_claimed:.3f}"
        if g.epsilon_fixed is not None:
            claimed += f" (reading; fixed {g.epsilon_fixed:.3f})"
        power = "—" if g.power is None else (f"{whole_percent(g.power)} / "
                                                 f"{whole_percent(g.joint_power or 0.0)}")
        table.add_row(g.group, str(g.canaries), str(g.included), f"{g.correct} / {g.guesses}",
                      f"{g.epsilon_lower_bound:.3f}", f"{g.joint_lower_bound:.3f}",
                      f"{g.mu_lower_bound:.3f}", f"{g.max_certifiable:.2f}", claimed, power)
    console.print(table)
    console.print("\n".join(result.statement()))
    console.print(f"claim: {claim_note(result)} (delta {result.delta:g}); an empirical lower "
                  "bound: above the claim shows a bug, below it proves nothing")
    if section.track:
        from dpfair.tracking.runs import ui_hint

        run_id = log_audit(p.tracking, section.method, config, dataset, result)
        console.print(f"MLflow audit run {run_id}; {ui_hint(p.tracking)}")
    if result.violation:
        raise typer.Exit(EXIT_VIOLATION)


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
    from flows.server import require_api_url

    require_api_url("dpfair serve")  # before the flows' imports (6-7 s)
    from flows.schedule import serve_experiment

    serve_experiment(str(params or DEFAULT_PARAMS), root)

