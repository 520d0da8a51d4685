"""A local Dask cluster listens on this machine only (issue 33.7): its dashboard has no login."""

from __future__ import annotations

import pytest

from dpfair.config.sections import PipelineSection


def test_the_local_dask_cluster_and_its_dashboard_bind_to_localhost():
    distributed = pytest.importorskip("distributed")
    from flows.experiment import task_runner

    runner = task_runner(PipelineSection(task_runner="dask", max_workers=1))
    kwargs = {**runner.cluster_kwargs, "n_workers": 1}
    with distributed.LocalCluster(**kwargs) as cluster:
        sockets = cluster.scheduler.http_server._sockets.values()
        hosts = {s.getsockname()[0] for s in sockets}
        assert hosts == {"127.0.0.1"}, hosts  # before: 0.0.0.0:8787
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        assert all(w.startswith("tcp://127.0.0.1:") for w in cluster.scheduler_info["workers"])
