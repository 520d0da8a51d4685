"""The experiment as a Prefect deployment on the cron schedule of params.yaml.

Schedules need a real Prefect server (the temporary one refuses to schedule): start one with
``prefect server start`` and point ``PREFECT_API_URL`` at it, then ``dpfair serve``.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import serve
from prefect.schedules import Cron

from dpfair.config import DEFAULT_PARAMS, load_params
from dpfair.errors import ConfigError
from flows.experiment import experiment_flow, task_runner


def deployment(params_path: str = DEFAULT_PARAMS, root: str = ".") -> object:
    """The scheduled deployment of the experiment flow (not yet registered)."""
    params = load_params(params_path)
    schedule = params.pipeline.schedule
    configured = experiment_flow.with_options(task_runner=task_runner(params.pipeline))
    return configured.to_deployment(
        name=schedule.name,
        schedule=Cron(schedule.cron, timezone=schedule.timezone),
        parameters={"params_path": str(Path(params_path).resolve()),
                    "root": str(Path(root).resolve())},
        tags=["dpfair", params.experiment.dataset],
    )


def serve_experiment(params_path: str = DEFAULT_PARAMS, root: str = ".") -> None:
    """Register the deployment and serve it until interrupted."""
    if not os.environ.get("PREFECT_API_URL"):
        raise ConfigError(
            "dpfair serve needs a running Prefect server: start one with "
            "`prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    serve(deployment(params_path, root))
