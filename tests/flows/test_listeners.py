"""The local Dask cluster of ``pipeline.task_runner: dask`` (one cluster for this file): it
listens on this machine only (issue 33.7: its dashboard has no login), and its workers load
``flows.dask_workers``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from dpfair.config.sections import PipelineSection


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    from flows.experiment import task_runner

    runner = task_runner(PipelineSection(task_runner="dask", max_workers=1))
    with distributed.LocalCluster(**{**runner.cluster_kwargs, "n_workers": 1}) as cluster:
        yield cluster


def test_the_local_dask_cluster_and_its_dashboard_bind_to_localhost(cluster):
    sockets = cluster.scheduler.http_server._sockets.values()
    hosts = {s.getsockname()[0] for s in sockets}
    assert hosts == {"127.0.0.1"}, hosts  # before: 0.0.0.0:8787
    assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    assert all(w.startswith("tcp://127.0.0.1:") for w in cluster.scheduler_info["workers"])


def _worker_filters() -> list[str]:
    return [type(f).__name__ for f in logging.getLogger("distributed.worker").filters]


def test_the_workers_drop_the_heartbeat_lost_at_close(cluster):
    """Each worker process (not this one) carries the filter of ``flows.dask_workers``."""
    from distributed import Client

    with Client(cluster) as client:
        filters = client.run(_worker_filters)
    assert list(filters.values()) == [["DropLostHeartbeat"]], filters
