"""Scheduled retraining that reacts to data: a Prefect deployment on the cron schedule of
params.yaml (issue #16, item 6).

Each scheduled run reads the data source's version (:func:`dpfair.data.source_version`, the
md5 of the source, computed without preparing it) and compares it with the version of the
source's latest *completed* release in the privacy ledger (:mod:`dpfair.ledger`). The same
version: the run skips (nothing is trained, nothing spent) and says so in its artifact. A new
version, or one whose last retrain failed: the experiment flow runs as a subflow (prepare,
tune, train, report, register), through the privacy gate before anything trains. A failed
retrain is charged (it may have released something) but completes nothing, so the next
trigger retries it, and the retry is charged again. Versions are shown by their published id.

The deployment's parameters are relative (``params.yaml`` in ``root``, default ``.``: the
folder ``dpfair serve`` was started in), never the absolute paths of one checkout; change them
for a run in Prefect's UI or with ``prefect deployment run -p root=/srv/project ...``.

Schedules need a real Prefect server (the temporary one refuses to schedule): start one with
``prefect server start`` and point ``PREFECT_API_URL`` at it (the environment or the active
Prefect profile: ``prefect config set PREFECT_API_URL=...``), then ``dpfair serve``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, serve, task
from prefect.cache_policies import NO_CACHE
from prefect.schedules import Cron

from dpfair.config.params import DEFAULT_PARAMS, load_params
from dpfair.data import source_version
from flows import artifacts
from flows.experiment import experiment_flow, gate, task_runner
from flows.server import require_api_url

data_version = task(source_version, name="data_version", retries=2, retry_delay_seconds=2,
                    cache_policy=NO_CACHE)


@flow(name="dpfair-retrain", flow_run_name=artifacts.flow_run_name)
def retrain_flow(params_path: str = DEFAULT_PARAMS, root: str = ".") -> dict[str, Any]:
    """Retrain when the data source changed since its latest completed release, else skip.
    ``params_path`` is relative to ``root`` (unless absolute)."""
    root_path = Path(root).resolve()
    path = root_path / params_path
    params = load_params(path)
    name = params.experiment.dataset
    version = data_version(name, params.dataset(name))
    privacy = gate(params, root_path)
    released = privacy.ledger.latest_version(name)
    if version == released:
        artifacts.publish(artifacts.artifact_key(artifacts.SKIPPED_KEY, name),
                          f"dpfair retrain skipped: {name} unchanged", {
            "data": f"{name}, version `{privacy.public_id(version)}`",
            "reason": "the latest completed release in the privacy ledger used this version; "
                      "nothing was trained and no privacy was spent",
        })
        return {"skipped": True, "data_version": privacy.public_id(version)}
    configured = experiment_flow.with_options(task_runner=task_runner(params.pipeline))
    out = configured(params_path=str(path), root=str(root_path))
    previous = None if released is None else privacy.public_id(released)
    return {"skipped": False, "previous_version": previous, **out}


def deployment(params_path: str = DEFAULT_PARAMS, root: str = ".") -> object:
    """The scheduled deployment of the retrain flow (not yet registered), with the parameters
    as given (relative ones stay relative to the serving process's folder)."""
    params = load_params(Path(root) / params_path)
    schedule = params.pipeline.schedule
    return retrain_flow.to_deployment(
        name=schedule.name,
        schedule=Cron(schedule.cron, timezone=schedule.timezone),
        parameters={"params_path": str(params_path), "root": str(root)},
        tags=["dpfair", params.experiment.dataset],
    )


def serve_experiment(params_path: str = DEFAULT_PARAMS, root: str = ".") -> None:
    """Register the deployment and serve it until interrupted (on the configured Prefect
    server: :func:`flows.server.require_api_url`)."""
    require_api_url("dpfair serve")
    serve(deployment(params_path, root))
