"""``flows.dask_workers``: a Dask worker drops the heartbeat record of a closing cluster, and
nothing else."""

from __future__ import annotations

import logging

from flows.dask_workers import HEARTBEAT_LOST, DropLostHeartbeat, dask_setup


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("distributed.worker", level, __file__, 1, message, None, None)


def test_only_the_lost_heartbeat_is_dropped():
    keep = DropLostHeartbeat().filter
    assert not keep(_record(HEARTBEAT_LOST + "."))  # the message distributed logs
    assert keep(_record("Compute Failed"))
    assert keep(_record("Unexpected exception during heartbeat. Closing worker."))


def test_the_setup_installs_the_filter_once(caplog):
    log = logging.getLogger("distributed.worker")
    before = list(log.filters)
    try:
        dask_setup(object())
        dask_setup(object())
        added = [f for f in log.filters if f not in before]
        assert [type(f) for f in added] == [DropLostHeartbeat]
        with caplog.at_level(logging.INFO, logger="distributed.worker"):
            log.error("%s.", HEARTBEAT_LOST, exc_info=OSError("Stream is closed"))
            log.error("Compute Failed")
        assert [r.getMessage() for r in caplog.records] == ["Compute Failed"]
    finally:
        log.filters[:] = before
