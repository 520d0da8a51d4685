"""What each worker process of dpfair's local Dask cluster loads at start (Dask's ``preload``,
:func:`flows.experiment.task_runner`).

When the flow ends, Prefect closes the cluster: the scheduler stops while a worker's periodic
heartbeat may be on its way, and the worker logs "Failed to communicate with scheduler during
heartbeat." with a traceback (a known race of ``distributed``'s shutdown). The run has
succeeded by then, so the user would see a traceback after a good run. The workers drop that
one record; a scheduler lost while tasks run still fails them, and the flow reports it.
"""

from __future__ import annotations

import logging
from typing import Any

#: the message of ``distributed.worker.Worker.heartbeat`` when the scheduler is unreachable
HEARTBEAT_LOST = "Failed to communicate with scheduler during heartbeat"


class DropLostHeartbeat(logging.Filter):
    """Drops the worker's record of a heartbeat that found the scheduler gone."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(HEARTBEAT_LOST)


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, called once the worker started: installs :class:`DropLostHeartbeat`
    on the worker's logger (once per process)."""
    log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, DropLostHeartbeat) for f in log.filters):
        log.addFilter(DropLostHeartbeat())
