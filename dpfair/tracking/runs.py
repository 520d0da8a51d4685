"""MLflow logging helpers.

Everything goes through an explicit :class:`mlflow.MlflowClient` and explicit run ids, never
MLflow's thread-local "active run": training tasks fan out over threads and processes, and
each must log into its own nested run.

Layout: one MLflow experiment per dataset, a parent run per pipeline run, nested runs (tag
``mlflow.parentRunId``) for each search and each final training, and for every tuning trial
only when ``tuning.release: all_trials`` (what a run releases: :mod:`dpfair.release.plan`). The
settings model ``TrackingConfig`` lives in :mod:`dpfair.settings` (no mlflow) and is
re-exported here.

What MLflow users expect (issue 17): experiments open on their runs (the experiment kind tag
:data:`EXPERIMENT_KIND`), runs carry MLflow's standard source tags (user, entry point, git
commit when known), datasets are logged inputs (:func:`log_dataset`), tables are MLflow table
artifacts (:func:`log_table`) and the selected model is a Model Registry version
(:mod:`dpfair.tracking.model_registry`).

A tracking server (an ``http(s)://`` URI) decides where artifacts go: experiments are created
without an artifact location, so a server started with ``--artifacts-destination`` stores
models and figures itself (proxied artifacts), and clients need no access to that store.
``tracking.artifact_root`` applies to a local store only.

Crashes: every run records the host and pid that opened it (tags ``dpfair.host`` and
``dpfair.pid``). A killed process leaves its runs RUNNING; :func:`fail_stale_runs`, called
when a pipeline starts, marks those of dead processes on this host FAILED with a note
(``dpfair.stale``), and :func:`read_results` reads only finished pipeline runs.
"""

from __future__ import annotations

import functools
import getpass
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.utils.mlflow_tags import (
    MLFLOW_DATASET_CONTEXT,
    MLFLOW_GIT_COMMIT,
    MLFLOW_SOURCE_NAME,
    MLFLOW_SOURCE_TYPE,
    MLFLOW_USER,
)

from dpfair.metric_keys import clean_key
from dpfair.processes import alive, host, uninterrupted
from dpfair.settings import TrackingConfig  # re-exported: callers read it from here too
from dpfair.tracking import empty_store
from dpfair.urls import mask_text, mask_url
from dpfair.workspace import durable_path, open_racing

_MAX_PARAM_LEN = 6000  # MLflow's limit on a parameter value
#: The experiment tag MLflow 3's UI reads to open an experiment on its runs (model training),
#: not on the GenAI traces overview (``ExperimentKind`` of MLflow's web app; the Python package
#: has no constant for it).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
UI_PORT = 5000
#: The stages of a run that, without a parent run, ran outside a pipeline.
STANDALONE_STAGES = ("final", "tuning")


def client(cfg: TrackingConfig) -> MlflowClient:
    """The client of ``cfg``'s store. A SIGTERM never cuts one of its calls: it is raised when
    the call ends (:func:`dpfair.processes.uninterrupted`), so the store is left consistent and
    unlocked, and the run can be ended FAILED."""
    uri = cfg.resolved_uri()
    _schema_ready(uri)
    return cast(MlflowClient, _Uninterrupted(MlflowClient(tracking_uri=uri)))


@functools.cache  # once per store and process (an error is not cached: tried again)
def _schema_ready(uri: str) -> None:
    """Open the database store ``uri`` once: its first use creates MLflow's schema, which
    processes started together race on (:func:`dpfair.workspace.open_racing`); a new SQLite
    file starts as a copy of MLflow's empty store (:mod:`dpfair.tracking.empty_store`)."""
    if uri.startswith(("sqlite", "postgresql")):
        with uninterrupted():
            open_racing(lambda: MlflowClient(tracking_uri=uri).search_experiments(max_results=1),
                        uri, seed=empty_store.seed)


class _Uninterrupted:
    """An ``MlflowClient`` whose every method runs inside :func:`~dpfair.processes.
    uninterrupted`."""

    def __init__(self, mlf: MlflowClient) -> None:
        self._mlf = mlf

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._mlf, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            with uninterrupted():
                return value(*args, **kwargs)

        return call


def remote(cfg: TrackingConfig) -> bool:
    """Whether ``cfg`` points at a tracking server (it decides where artifacts go)."""
    return cfg.resolved_uri().startswith(("http://", "https://"))


def experiment_id(cfg: TrackingConfig, dataset: str) -> str:
    """The experiment of ``dataset``, tagged as a model-training experiment
    (:data:`EXPERIMENT_KIND`; an older experiment gets the tag too). Created under
    ``tracking.artifact_root`` for a local store; on a tracking server, where the server puts
    artifacts (proxied: the client writes nothing to its own disk)."""
    mlf = client(cfg)
    name = f"{cfg.experiment_prefix}-{dataset}"
    found = mlf.get_experiment_by_name(name)
    if found is None:
        location = None
        if not remote(cfg):
            root = cfg.artifact_root
            if "://" not in root:
                root = durable_path(root).resolve().as_uri()  # not in a DVC temp copy
            location = f"{root}/{name}"
        try:
            return mlf.create_experiment(name, artifact_location=location,
                                         tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:  # created concurrently by another worker
            found = mlf.get_experiment_by_name(name)
            if found is None:
                raise
    if found.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        mlf.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return found.experiment_id


def existing_experiment(cfg: TrackingConfig, dataset: str) -> str | None:
    """The id of ``dataset``'s experiment if it exists; a local SQLite store that does not
    exist yet is not created (a run refused before it starts leaves no store behind)."""
    uri = cfg.resolved_uri()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        return None
    found = client(cfg).get_experiment_by_name(f"{cfg.experiment_prefix}-{dataset}")
    return None if found is None else found.experiment_id


@functools.cache
def git_commit() -> str | None:
    """The git commit of the working directory's checkout, or None outside one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def source_tags() -> dict[str, str]:
    """MLflow's standard source tags (the runs table's User and Source columns, the git
    commit on the run page): the entry point is the command that ran (``dpfair run``)."""
    argv = [Path(sys.argv[0]).name, *sys.argv[1:2]] if sys.argv and sys.argv[0] else ["python"]
    tags = {MLFLOW_USER: getpass.getuser(), MLFLOW_SOURCE_NAME: " ".join(argv),
            MLFLOW_SOURCE_TYPE: "LOCAL"}
    if commit := git_commit():
        tags[MLFLOW_GIT_COMMIT] = commit
    return tags


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> ``{"a.b": "value"}`` strings, as MLflow params. ``None`` (an unset
    option) is left out: a param reading "None" says nothing. A URL's password is masked."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif value is not None:
            flat[name] = mask_text(str(value))[:_MAX_PARAM_LEN]
    return flat


@contextmanager
def run(
    cfg: TrackingConfig,
    experiment: str,
    name: str,
    *,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Open a (nested) run and yield its id; it ends FINISHED, or FAILED if the body raises.
    The run is tagged with this host and pid (see :func:`fail_stale_runs`). A training or
    search outside a pipeline (``dpfair train``/``tune``: no parent) is named and tagged
    ``standalone``, so that it never reads like a pipeline's child."""
    all_tags = {**source_tags(), "dpfair.host": host(), "dpfair.pid": str(os.getpid()),
                **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    elif all_tags.get("dpfair.stage") in STANDALONE_STAGES:
        name, all_tags["dpfair.standalone"] = f"{name} · standalone", "true"
    mlf = client(cfg)
    created = mlf.create_run(experiment, tags=all_tags, run_name=name)
    with _terminated(mlf, created.info.run_id) as run_id:
        yield run_id


@contextmanager
def reopen(cfg: TrackingConfig, run_id: str, tags: Mapping[str, str] | None = None
           ) -> Iterator[str]:
    """Set a finished or failed run RUNNING again, owned by this process (its ``dpfair.host``
    and ``dpfair.pid``), and end it as :func:`run` does (a resumed pipeline,
    :mod:`dpfair.pipeline.resume`)."""
    mlf = client(cfg)
    mlf.update_run(run_id, status="RUNNING")
    set_tags(cfg, run_id, {"dpfair.host": host(), "dpfair.pid": str(os.getpid()), **(tags or {})})
    with _terminated(mlf, run_id):
        yield run_id


@contextmanager
def _terminated(mlf: MlflowClient, run_id: str) -> Iterator[str]:
    """End ``run_id`` FINISHED, or FAILED if the body raises."""
    try:
        yield run_id
    except BaseException:
        mlf.set_terminated(run_id, status="FAILED")
        raise
    mlf.set_terminated(run_id, status="FINISHED")


def fail_stale_runs(cfg: TrackingConfig, experiment: str) -> list[str]:
    """Mark FAILED the runs of ``experiment`` left RUNNING by a dead process on this host (its
    pid gone, or reused by a process started after the run), with a note in tag
    ``dpfair.stale``; returns their ids. Runs of other hosts, and runs without a recorded
    pid, are left alone: their owner's liveness cannot be known from here."""
    mlf = client(cfg)
    here, stale = host(), []
    for found in mlf.search_runs([experiment], "attributes.status = 'RUNNING'"):
        tags, info = found.data.tags, found.info
        pid = tags.get("dpfair.pid", "")
        if tags.get("dpfair.host") != here or not pid.isdigit():
            continue
        if alive(int(pid), since=info.start_time / 1000):
            continue
        set_tags(cfg, info.run_id, {"dpfair.stale": json.dumps(
            {"pid": int(pid), "host": here, "marked_by": os.getpid(),
             "marked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})})
        add_description(cfg, info.run_id, f"process {pid} on {here} died while this run was "
                        "RUNNING: marked FAILED (tag dpfair.stale)")
        mlf.set_terminated(info.run_id, status="FAILED")
        stale.append(info.run_id)
    return stale


def log_params(cfg: TrackingConfig, run_id: str, params: Mapping[str, Any]) -> None:
    flat = flatten(params)
    items = [Param(k, v) for k, v in flat.items()]
    for i in range(0, len(items), 100):
        client(cfg).log_batch(run_id, params=items[i : i + 100])


def metric_key(name: str) -> str:
    """``name`` as a metric key MLflow accepts: each ``/``-separated part cleaned by
    :func:`~dpfair.training.evaluation.clean_key` (``"acc/<=50K"`` -> ``"acc/le 50K"``), a
    part left empty or all dots (a path such as ``..``) written ``_``."""
    parts = [clean_key(part) for part in name.split("/")]
    return "/".join(part if part.strip(".") else "_" for part in parts)


def log_metrics(cfg: TrackingConfig, run_id: str, metrics: Mapping[str, float], step: int = 0,
                model_id: str | None = None) -> None:
    """Log finite metrics (of the logged model ``model_id`` too, when given); NaN/inf are
    skipped (an absent group is not a zero)."""
    log_metric_steps(cfg, run_id, {step: metrics}, model_id)


def log_metric_steps(cfg: TrackingConfig, run_id: str,
                     steps: Mapping[int, Mapping[str, float]], model_id: str | None = None
                     ) -> None:
    """:func:`log_metrics` of several steps (``{step: metrics}``) in one write."""
    now = int(time.time() * 1000)
    items = [
        Metric(metric_key(k), float(v), now, step, model_id=model_id)
        for step, metrics in steps.items() for k, v in metrics.items()
        if v is not None and math.isfinite(float(v))
    ]
    for i in range(0, len(items), 500):
        client(cfg).log_batch(run_id, metrics=items[i : i + 500])


def set_tags(cfg: TrackingConfig, run_id: str, tags: Mapping[str, Any]) -> None:
    items = [RunTag(k, str(v)) for k, v in tags.items()]
    if items:
        client(cfg).log_batch(run_id, tags=items)


#: MLflow's run description (a tag the UI shows as the run's "Description").
DESCRIPTION_TAG = "mlflow.note.content"


def tag_number(value: float) -> str:
    """A tag's number: six significant digits, ``inf`` when unbounded (machine-readable)."""
    return f"{value:.6g}"


def described(tags: Mapping[str, str], notes: Mapping[str, str]) -> dict[str, str]:
    """``tags``, whose values are machine-readable (a token, a number, JSON), plus the run's
    description holding what they mean in words: a line ``- key: sentence`` per entry of
    ``notes``."""
    return {**tags, DESCRIPTION_TAG: "\n".join(f"- {k}: {v}" for k, v in notes.items())}


def add_description(cfg: TrackingConfig, run_id: str, line: str) -> None:
    """Append ``line`` to the run's description (prose that no tag value holds)."""
    before = client(cfg).get_run(run_id).data.tags.get(DESCRIPTION_TAG, "")
    set_tags(cfg, run_id, {DESCRIPTION_TAG: f"{before}\n- {line}" if before else f"- {line}"})


def log_text(cfg: TrackingConfig, run_id: str, text: str, artifact_file: str) -> None:
    client(cfg).log_text(run_id, text, artifact_file)


def log_json(cfg: TrackingConfig, run_id: str, payload: Any, artifact_file: str) -> None:
    client(cfg).log_text(run_id, json.dumps(payload, indent=2, default=str), artifact_file)


def log_file(cfg: TrackingConfig, run_id: str, path: str | Path, artifact_dir: str = "") -> None:
    client(cfg).log_artifact(run_id, str(path), artifact_dir or None)


def log_table(cfg: TrackingConfig, run_id: str, table: pd.DataFrame, artifact_file: str) -> None:
    """``table`` as an MLflow table artifact (the UI shows it as a table; runs compare in the
    artifact view); the index becomes the first column."""
    frame = table.reset_index()
    frame.columns = [str(c) for c in frame.columns]
    client(cfg).log_table(run_id, frame.astype(str), artifact_file)


def log_dataset(cfg: TrackingConfig, run_id: str, *, name: str, digest: str, source: str,
                context: str = "training", schema: Mapping[str, Any] | None = None) -> None:
    """The run's input dataset (the runs table's Dataset column): ``name``, ``digest`` (the
    data version) and ``source`` (where it was read). ``schema`` holds public facts only
    (no row counts: they are not covered by ε)."""
    dataset = Dataset(name=name, digest=digest[:36], source_type="local",
                      source=json.dumps({"uri": source}),
                      schema=json.dumps(dict(schema or {}), default=str))
    inputs = [DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])]
    try:
        client(cfg).log_inputs(run_id, datasets=inputs)
    except Exception as exc:  # the store's get-or-create of the dataset is not atomic:
        text = str(exc).lower()  # another process (a concurrent tune) made it meanwhile
        if "unique constraint" not in text and "duplicate key" not in text:
            raise
        client(cfg).log_inputs(run_id, datasets=inputs)  # now found, not created


def run_url(cfg: TrackingConfig, experiment_id: str, run_id: str) -> str:
    """The run's page: on the tracking server, or on the local UI of :func:`ui_hint`."""
    base = cfg.resolved_uri().rstrip("/") if remote(cfg) else f"http://127.0.0.1:{UI_PORT}"
    return f"{mask_url(base)}/#/experiments/{experiment_id}/runs/{run_id}"


def ui_command(cfg: TrackingConfig) -> str:
    """The exact command that serves a local store in the MLflow UI (its path made absolute:
    the command works from any folder)."""
    uri = cfg.resolved_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"
    elif "://" not in uri:
        uri = Path(uri).resolve().as_uri()
    mlflow = Path(sys.executable).parent / "mlflow"
    program = mlflow if mlflow.exists() else "mlflow"
    # telemetry off for the UI's process too, on a line of its own (a shell continuation), so
    # that neither line outgrows a 120-column terminal
    return (f"{TELEMETRY_OFF} \\\n    {program} ui --backend-store-uri {mask_url(uri)} "
            f"--port {UI_PORT}")


#: the switch a printed ``mlflow ui`` / ``mlflow server`` command carries: MLflow's own
#: (:data:`dpfair.NO_TELEMETRY`)
TELEMETRY_OFF = "MLFLOW_DISABLE_TELEMETRY=true"


def ui_hint(cfg: TrackingConfig) -> str:
    """How to open the MLflow UI on these results: the tracking server's address, or the
    command that serves a local store (:func:`ui_command`)."""
    if remote(cfg):
        return f"open the MLflow UI at {mask_url(cfg.resolved_uri().rstrip('/'))}"
    return f"open the MLflow UI with:\n  {ui_command(cfg)}"


def read_results(cfg: TrackingConfig, run_id: str | None = None,
                 dataset: str | None = None) -> tuple[str, str]:
    """``(run id, results table markdown)`` of a pipeline run: ``run_id``, else the latest
    that finished on ``dataset`` (None: on any dataset). A failed or killed run is read only
    by its id."""
    mlf = client(cfg)
    if run_id is None:
        prefix = f"{cfg.experiment_prefix}-"
        experiments = [e.experiment_id for e in mlf.search_experiments()
                       if (e.name == f"{prefix}{dataset}" if dataset else
                           e.name.startswith(prefix))]
        found = mlf.search_runs(
            experiments,
            "tags.`dpfair.stage` = 'pipeline' and attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"], max_results=1) if experiments else []
        if not found:
            on = f" of dataset {dataset!r}" if dataset else ""
            raise LookupError(f"no finished pipeline run{on} in {mask_url(cfg.resolved_uri())}; "
                              "run `dpfair run` first, pass --dataset for another dataset, or "
                              "--run-id for a failed run")
        run_id = found[0].info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        path = mlf.download_artifacts(run_id, "results/results.md", tmp)
        return run_id, Path(path).read_text()
