"""Prefect retries only a failure that may pass: a deterministic user error (bad data or
settings) fails once, an unreachable service or an unexpected error is retried."""

from __future__ import annotations

from prefect.states import Failed

from dpfair.errors import ConfigError, DataError, UnreachableError
from tasks.pipeline import may_pass, prepare_data


def _failed(error: BaseException) -> Failed:
    return Failed(data=error, message=repr(error))


def test_user_errors_are_never_retried():
    assert not may_pass(None, None, _failed(DataError("data/x.csv: no column 'y'")))
    assert not may_pass(None, None, _failed(ConfigError("datasets.x.target: required")))


def test_transient_failures_are():
    assert may_pass(None, None, _failed(UnreachableError("tracking server did not answer")))
    assert may_pass(None, None, _failed(OSError("disk busy")))
    assert prepare_data.retries == 2 and prepare_data.retry_condition_fn is may_pass
