"""What every ``dpfair`` command shares: the console, number formats, ``--params`` and the
log levels (``-q``/``-v``). Imports only typer, rich and ``dpfair.settings`` (``--help`` stays
fast)."""

from __future__ import annotations

import gc
import logging
import os
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from dpfair.settings import DEFAULT_PARAMS, STEPS_LOGGER, VERBOSITY

if TYPE_CHECKING:
    from dpfair.config.params import Params

__all__ = ["WIDTH", "ParamsOption", "checking", "console", "ends_with_command", "fit",
           "freeze_if_ending", "percent", "print_fitting", "print_registered",
           "library_levels", "resolve_params", "score", "set_verbosity", "show_version"]

console = Console(soft_wrap=True)
WIDTH = 120  # the terminal width every line dpfair prints is built for
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


#: Whether this process ends when its command does: set by :func:`dpfair.cli.main` (the
#: ``dpfair`` script, ``python -m dpfair.cli``), not where ``app()`` is called from Python.
_ends_with_command = False


def ends_with_command() -> None:
    """Mark this process as the ``dpfair`` command's own (see :func:`checking`)."""
    global _ends_with_command
    _ends_with_command = True


@contextmanager
def checking() -> Iterator[None]:
    """Around a command's checks (its settings, data and model, before any work): Python's
    cyclic garbage collector is paused, and restored as it was when they end or fail. The
    imports they need (torch, pandas, pydantic models) create millions of objects that all stay
    alive, which the collector would scan again and again (about 0.4 s of a 3 s refusal, and
    nothing to free); the work after the checks runs with the collector as usual.

    When a check refuses in the command's own process, which then ends with nothing begun,
    those objects are frozen (``gc.freeze``): the interpreter's exit skips scanning them again
    (0.3 s once torch is loaded) and still runs every exit handler. Where ``app()`` is called
    from Python the objects are left alone, since that process goes on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    except BaseException:
        freeze_if_ending()
        raise
    finally:
        if enabled:
            gc.enable()


def freeze_if_ending() -> None:
    """In the command's own process, which is about to end (a refused check, a SIGTERM), freeze
    every live object (``gc.freeze``): the interpreter's last collection at exit skips them
    (after a run with MLflow, Prefect and torch loaded it took 6-12 s of a SIGTERM's exit on a
    loaded machine) and every exit handler still runs. Elsewhere (``app()`` called from
    Python, whose process goes on) nothing is done."""
    if _ends_with_command:
        gc.freeze()


def show_version(value: bool) -> None:
    """``--version``: print dpfair's version and exit."""
    if value:
        from importlib.metadata import version

        console.print(f"dpfair {version('dpfair')}")
        raise typer.Exit()


def set_verbosity(quiet: bool, verbose: bool) -> None:
    """Log levels: by default dpfair's own lines (one per step of the flow, warnings) and the
    third-party libraries' warnings only; ``verbose``: also their INFO lines (Prefect's task
    runs, Optuna's studies, MLflow's "View run" links, Dask's cluster, DVC's stages) and
    dp_accounting's notes on the RDP orders it leaves out (absl warnings: an order left out
    only loosens RDP's bound, and the smaller of PLD and RDP is reported); ``quiet``: errors
    only. Set through the environment before MLflow, Prefect and Dask are imported (they read
    it then), so worker processes inherit it (a Dask worker sets absl's level from
    ``DASK_LOGGING__ABSL``; a user's own variables win, but under ``-q`` and ``-v``);
    :func:`library_levels` again once Optuna is imported."""
    if quiet and verbose:
        raise typer.BadParameter("-q and -v exclude each other")
    level = "ERROR" if quiet else "INFO" if verbose else "WARNING"
    os.environ[VERBOSITY] = "quiet" if quiet else "verbose" if verbose else "default"
    for var, value in (("MLFLOW_LOGGING_LEVEL", level), ("PREFECT_LOGGING_LEVEL", level),
                       ("PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL", level),
                       ("DASK_LOGGING__DISTRIBUTED", level),
                       ("DASK_LOGGING__ABSL", "INFO" if verbose else "ERROR"),
                       ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", str(not verbose).lower())):
        if quiet or verbose:
            os.environ[var] = value
        else:
            os.environ.setdefault(var, value)
    logging.getLogger("mlflow").setLevel(os.environ["MLFLOW_LOGGING_LEVEL"])
    library_levels()
    for own in ("dpfair", "flows", "tasks"):
        logging.getLogger(own).setLevel("ERROR" if quiet else "INFO")
    steps = logging.getLogger(STEPS_LOGGER)
    if not steps.handlers:  # the step lines: the message alone, on stderr, within 120 columns
        handler = logging.StreamHandler()
        handler.setFormatter(_FittingFormatter("%(message)s"))
        steps.addHandler(handler)
        steps.propagate = False


class _FittingFormatter(logging.Formatter):
    """A log record's text with every line within 120 columns (:func:`fit`)."""

    def format(self, record: logging.LogRecord) -> str:
        return fit(super().format(record))


def library_levels() -> None:
    """Optuna's level (:func:`set_verbosity`'s): Optuna sets its own to INFO when imported;
    absl's (dp_accounting's RDP notes) in this process."""
    verbosity = os.environ.get(VERBOSITY, "default")
    logging.getLogger("optuna").setLevel(
        {"quiet": "ERROR", "verbose": "INFO"}.get(verbosity, "WARNING"))
    logging.getLogger("absl").setLevel(os.environ.get("DASK_LOGGING__ABSL", "ERROR"))


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
    from dpfair.config.params import Params, load_params

    if path is None:
        default = Path(DEFAULT_PARAMS)
        return load_params(default) if default.is_file() else Params()
    return load_params(path)


def fit(text: str) -> str:
    """``text`` with each line longer than 120 columns wrapped between words (a word longer
    than a line, such as a path or a URL, on a line of its own, whole); a wrapped line's
    continuations keep its indentation."""
    lines = []
    for line in text.splitlines() or [""]:
        indent = line[: len(line) - len(line.lstrip())]
        lines += [line] if len(line) <= WIDTH else textwrap.wrap(
            line, WIDTH, subsequent_indent=indent, break_long_words=False,
            break_on_hyphens=False)
    return "\n".join(lines)


def print_fitting(text: str, tail: str) -> None:
    """``text tail`` on one line where it fits 120 columns, else ``tail`` (a path, a URL, a
    command) on a line of its own."""
    line = f"{text} {tail}"
    console.print(line if len(line) <= WIDTH else f"{fit(text)}\n  {tail}", soft_wrap=True,
                  markup=False, highlight=False)


def print_registered(registered: dict[str, str]) -> None:
    """The registered model's lines: its version and aliases, the command that predicts and,
    for a version that is not @champion, the command that makes it so."""
    name, number, champion = (registered[k] for k in ("name", "version", "champion"))
    aliases = ("@challenger, @champion" if champion == number else
               f"@challenger; @champion stays version {champion}")
    command = f"dpfair predict --model {name} --input rows.csv --output preds.csv"
    if len(command) > WIDTH - 2:  # a long name: the files on a shell continuation line
        command = command.replace(" --input", " \\\n    --input")
    print_fitting(f"registered: {name} version {number} ({aliases}); predict:", command)
    if champion != number:
        print_fitting("to serve it as @champion:", f"dpfair promote {name} {number}")
