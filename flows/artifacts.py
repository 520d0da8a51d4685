"""Where a flow run's results are, from both sides (issue #17, item 3).

- Prefect: the flow run gets a markdown artifact (key ``dpfair-results-<dataset>``,
  :func:`artifact_key`: one history per dataset) holding the MLflow run id and link, the data
  version, the privacy ledger's spend and the results table, and a tag ``mlflow-run:<id>``
  naming its MLflow parent run. A skipped retrain's note has its own key
  (``dpfair-skipped-<dataset>``): it never hides the latest results.
- Both name a pipeline's run after its dataset and start time (:func:`flow_run_name`).
- MLflow: the parent run is tagged with the Prefect flow run's id (and its UI address when
  Prefect knows one: ``PREFECT_UI_URL`` set in the environment or the active profile).
"""

from __future__ import annotations

import re
from pathlib import Path

from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run
from prefect.settings import get_current_settings

from dpfair.config.params import DEFAULT_PARAMS, load_params
from dpfair.tracking.run_log import pipeline_run_name
from dpfair.tracking.runs import TrackingConfig, remote, run_url, ui_command

RESULTS_KEY, SKIPPED_KEY = "dpfair-results", "dpfair-skipped"
PREFECT_RUN_TAG = "dpfair.prefect_flow_run_id"
PREFECT_URL_TAG = "dpfair.prefect_flow_run_url"
MLFLOW_RUN_TAG = "mlflow-run:"

__all__ = ["MLFLOW_RUN_TAG", "PREFECT_RUN_TAG", "PREFECT_URL_TAG", "RESULTS_KEY", "SKIPPED_KEY",
           "artifact_key", "flow_run_name", "mlflow_link", "prefect_tags", "publish",
           "tag_flow_run"]


def flow_run_name() -> str:
    """A flow run's name in Prefect's UI: the dataset and when it started, as the MLflow
    pipeline run's (:func:`dpfair.tracking.run_log.pipeline_run_name`); read from the run's
    ``params_path`` (relative to its ``root``)."""
    given = flow_run.parameters
    path = Path(given.get("root", ".")) / given.get("params_path", DEFAULT_PARAMS)
    return pipeline_run_name(load_params(path).experiment.dataset)


def prefect_tags() -> dict[str, str]:
    """MLflow tags naming the current Prefect flow run (none outside a flow run)."""
    if not flow_run.id:
        return {}
    url = flow_run.ui_url if get_current_settings().ui_url else None  # else "None/flow-runs"
    return {PREFECT_RUN_TAG: str(flow_run.id), **({PREFECT_URL_TAG: url} if url else {})}


def tag_flow_run(mlflow_run_id: str) -> None:
    """Tag the current Prefect flow run with its MLflow run ``mlflow-run:<id>``."""
    if not flow_run.id:
        return
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run.id)
        client.update_flow_run(current.id, tags=[*current.tags, f"{MLFLOW_RUN_TAG}{mlflow_run_id}"])


def mlflow_link(tracking: TrackingConfig, experiment_id: str, run_id: str) -> str:
    """Markdown linking MLflow's page of run ``run_id`` (:func:`dpfair.tracking.runs.run_url`); for
    a local store, with the command that serves it."""
    url = run_url(tracking, experiment_id, run_id)
    if remote(tracking):
        return f"[{url}]({url})"
    return f"[{url}]({url}) once `{ui_command(tracking)}` serves the local store"


def artifact_key(kind: str, dataset: str) -> str:
    """``<kind>-<dataset>`` in the characters a Prefect artifact key allows (lowercase letters,
    digits, dashes)."""
    return f"{kind}-" + (re.sub(r"[^a-z0-9-]+", "-", dataset.lower()).strip("-") or "data")


def publish(key: str, title: str, facts: dict[str, str], body: str = "") -> None:
    """The flow run's artifact ``key``: ``title``, one line per fact, then ``body``."""
    lines = [f"# {title}", "", *(f"- **{k}**: {v}" for k, v in facts.items())]
    create_markdown_artifact(
        markdown="\n".join(lines) + ("\n\n" + body if body else "\n"),
        key=key, description=title,
    )
