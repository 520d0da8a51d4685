"""The CLI's one error boundary, ``@cli_errors`` (on every command of :mod:`dpfair.cli`).

An expected failure is printed as one message that names the problem and the fix, without a
traceback: every ``dpfair.errors.DpfairError``; a ``ValueError`` or ``LookupError`` raised by
dpfair's own code; pydantic's ``ValidationError``; ``OSError`` (names the path); MLflow's,
Optuna's and SQLAlchemy's errors (tracking and storage). Anything else is a bug: its
traceback, and a line asking to report it with the dpfair version. Passwords of URLs in
either are masked (:func:`dpfair.urls.mask_text`). Every command first removes the tuning job
folders that killed processes left (:mod:`dpfair.processes`).

Exit codes (README, "Exit codes"): 0 done; 1 a bug; 2 bad input (configuration, data, a path,
an unknown model; also typer's usage errors); 3 a privacy budget refused the release
(``BudgetExceededError``: nothing ran); 4 a service or folder could not be reached
(``UnreachableError``: the tracking server, a storage; a path without permission or on a
read-only file system); 5 ``dpfair audit`` printed a
VIOLATION (the run leaks more than its ε claims; not an error of dpfair's).
Imports only typer, rich, pydantic, ``dpfair.errors`` and ``dpfair.cli.console`` (``dpfair --help``
stays fast).
"""

from __future__ import annotations

import errno
import functools
import logging
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.text import Text

from dpfair.cli.console import fit, freeze_if_ending
from dpfair.errors import (
    BudgetExceededError,
    ConfigError,
    DataError,
    DpfairError,
    PrivacyError,
    Terminated,
    TuningError,
    UnreachableError,
    format_validation_error,
    user_exit,
)
from dpfair.processes import remove_stale_job_dirs
from dpfair.urls import mask_text

__all__ = ["EXIT_BUDGET", "EXIT_BUG", "EXIT_UNREACHABLE", "EXIT_USAGE", "cli_errors",
           "describe_failure", "exit_code", "user_errors_once"]

EXIT_BUG = 1
EXIT_USAGE = 2  # bad input: configuration, data, a path, an unknown model
EXIT_BUDGET = 3  # a privacy budget refused the release before anything ran
EXIT_UNREACHABLE = 4  # a service or folder could not be reached
EXIT_VIOLATION = 5  # `dpfair audit` found a run leaking more than its ε claims

err_console = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])

# The label of a DpfairError's message (the first class that matches).
_ERROR_KINDS: tuple[tuple[type[Exception], str], ...] = (
    (BudgetExceededError, "budget refused"),
    (ConfigError, "configuration error"),
    (DataError, "data error"),
    (PrivacyError, "privacy error"),
    (TuningError, "tuning error"),
    (UnreachableError, "unreachable"),
)
_STORAGE_FIX = ("give --storage (or tuning.storage) as sqlite:///FILE, journal:PATH or "
                "postgresql://USER@HOST/DB, and check that it can be reached and written")
# The adapters' errors: (module, class, label, fix). Looked up only among modules already
# imported (no error of another can occur): the boundary itself imports nothing heavy.
_ADAPTER_ERRORS = (
    ("mlflow.exceptions", "MlflowException", "tracking error", "check tracking.uri (is the "
     "server running?) and tracking.artifact_root (may you write there?) in the parameters file"),
    ("optuna.exceptions", "OptunaError", "storage error", _STORAGE_FIX),
    ("sqlalchemy.exc", "SQLAlchemyError", "storage error", _STORAGE_FIX),
)


def _raised_by_dpfair(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in dpfair's own code (a check of ours), not deep in a library."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = "" if tb is None else str(tb.tb_frame.f_globals.get("__name__", ""))
    return module.split(".")[0] in ("dpfair", "flows", "tasks")


def describe_failure(exc: Exception) -> tuple[str, str] | None:
    """``(label, message with its fix)`` of an expected failure, or None for a bug."""
    if isinstance(exc, DpfairError):
        return next((lbl for cls, lbl in _ERROR_KINDS if isinstance(exc, cls)), "error"), str(exc)
    if isinstance(exc, ValidationError):
        lines = format_validation_error(exc, BaseModel, prefix=(exc.title,))
        return "configuration error", (f"{lines}\nfix: correct these values in the parameters "
                                       "file or the command-line options")
    if isinstance(exc, OSError):
        if exc.filename is None:
            return "system error", str(exc)
        paths = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return "file error", (f"cannot use {paths}: {exc.strerror}\nfix: check that the path "
                              "exists (or can be created) and that you may write there, or "
                              "choose another (--out, --storage, --params, tracking.*)")
    for module, name, label, fix in _ADAPTER_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return label, f"{exc}\nfix: {fix}"
    if isinstance(exc, ValueError | LookupError) and _raised_by_dpfair(exc):
        return "error", str(exc)
    return None


#: The system errors of a place that exists but may not be used (exit code 4, as an unwritable
#: folder that dpfair's checks find): no permission, a read-only file system.
_UNUSABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def exit_code(exc: Exception) -> int:
    """The exit code of an expected failure (module docstring)."""
    if isinstance(exc, BudgetExceededError):
        return EXIT_BUDGET
    if isinstance(exc, UnreachableError) or (isinstance(exc, OSError)
                                             and exc.errno in _UNUSABLE):
        return EXIT_UNREACHABLE
    return EXIT_USAGE


def cli_errors(func: F) -> F:
    """The CLI's error boundary: an expected failure is one message and its exit code
    (:func:`exit_code`); a bug is its traceback and a request to report it, exit code 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        remove_stale_job_dirs()  # what a SIGKILLed tuning left (a pickled dataset): gone
        try:
            return func(*args, **kwargs)
        except Terminated:  # SIGTERM: the process ends now
            freeze_if_ending()
            raise
        except (typer.Exit, typer.Abort, typer.BadParameter):
            raise  # typer's own exits and usage errors
        except SystemExit as exc:  # user code's sys.exit: never a silent exit code 0
            _print_error("configuration error", str(
                user_exit(exc, "code of yours (a model, a factory or a callback)")))
            raise typer.Exit(EXIT_USAGE) from None
        except Exception as exc:
            known = describe_failure(exc)
            if known is None:
                from importlib.metadata import version

                sys.stderr.write(mask_text("".join(traceback.format_exception(exc))))
                err_console.print(fit(f"This is a bug in dpfair {version('dpfair')} (Python "
                                      f"{sys.version.split()[0]}), not in your input: please "
                                      "report it with the command you ran and the traceback "
                                      "above."), soft_wrap=True, highlight=False, markup=False)
                raise typer.Exit(EXIT_BUG) from None
            label, message = known
            _print_error(label, mask_text(message))
            raise typer.Exit(exit_code(exc)) from None

    return wrapper  # type: ignore[return-value]


def _print_error(label: str, message: str) -> None:
    """``label: message`` on stderr, the label in bold red, every line within 120 columns
    (:func:`dpfair.cli.console.fit`)."""
    text = Text(fit(f"{label}: {message}"))
    text.stylize("bold red", 0, len(label) + 1)
    err_console.print(text, soft_wrap=True, highlight=False)


#: Prefect's one line of a failed task or flow run: "... encountered an exception[:] Class: ..."
_FAILED_STATE = re.compile(r"encountered an exception:? (\w+):")


def _user_error_names(cls: type[Exception] = DpfairError) -> set[str]:
    return {cls.__name__}.union(*(_user_error_names(sub) for sub in cls.__subclasses__()))


class _UserErrorsOnce(logging.Filter):
    """Prefect's records of a user error that a task or the flow raised: its traceback is
    dropped and its "Finished in state" line no longer repeats the message, which the error
    boundary prints once at the end (a bug keeps Prefect's records as they are)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], DpfairError):
            return False
        found = _FAILED_STATE.search(str(record.msg))
        if found and found.group(1) in _user_error_names():
            record.msg, record.args = f"Finished in state Failed ({found.group(1)}: below)", ()
        return True


def user_errors_once() -> None:
    """Install :class:`_UserErrorsOnce` on Prefect's task-run and flow-run loggers (``dpfair
    run``: a user error inside the flow is printed once, without a traceback)."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UserErrorsOnce) for f in logger.filters):
            logger.addFilter(_UserErrorsOnce())
