"""-q / -v and the levels of the libraries dpfair drives (issue 43): set in this process and
in the environment its worker processes (Dask's included) read."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from dpfair.cli.console import set_verbosity

LOGGERS = ("absl", "optuna", "mlflow", "dpfair", "flows", "tasks")
VARIABLES = ("DASK_LOGGING__ABSL", "DASK_LOGGING__DISTRIBUTED", "DPFAIR_VERBOSITY",
             "MLFLOW_LOGGING_LEVEL", "PREFECT_LOGGING_LEVEL",
             "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL",
             "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")


@pytest.fixture
def levels_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The variables unset, and the loggers' levels as they were afterwards."""
    for var in VARIABLES:  # set first: monkeypatch then restores an unset one as unset
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    before = {name: logging.getLogger(name).level for name in LOGGERS}
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize(("quiet", "verbose", "absl", "dask"), [
    (True, False, "ERROR", "ERROR"), (False, False, "ERROR", "WARNING"),
    (False, True, "INFO", "INFO")])
@pytest.mark.usefixtures("levels_restored")
def test_absl_and_dask_levels_follow_q_and_v(quiet, verbose, absl, dask):
    """dp_accounting's absl warnings (RDP orders it leaves out) only with -v, here and in a
    Dask worker (``DASK_LOGGING__ABSL``: Dask's logging config sets that logger's level)."""
    set_verbosity(quiet, verbose)
    assert os.environ["DASK_LOGGING__ABSL"] == absl
    assert os.environ["DASK_LOGGING__DISTRIBUTED"] == dask
    absl_logger = logging.getLogger("absl")
    assert logging.getLevelName(absl_logger.level) == absl
    assert absl_logger.isEnabledFor(logging.WARNING) == verbose


@pytest.mark.usefixtures("levels_restored")
def test_a_long_step_line_is_wrapped_within_120_columns():
    """The flow's one line per step (many methods searched) fits 120 columns on stderr."""
    from dpfair.cli.console import WIDTH
    from dpfair.settings import STEPS_LOGGER

    set_verbosity(False, False)
    [handler] = [h for h in logging.getLogger(STEPS_LOGGER).handlers
                 if type(h) is logging.StreamHandler]  # not pytest's capturing ones
    message = "tune and train: 60 final runs of 30 methods (" + ", ".join(
        f"method_{i}" for i in range(30)) + " searched)"
    text = handler.format(logging.LogRecord(STEPS_LOGGER, logging.INFO, __file__, 1, message,
                                            None, None))
    assert len(text.splitlines()) > 1 and all(len(line) <= WIDTH for line in text.splitlines())
    assert text.split() == message.split()
