"""The experiment flow: prepare -> plan -> reserve -> tune -> train x seeds -> evaluate ->
register -> publish, one named step each.

``run_experiment`` validates params.yaml before anything runs, then starts the flow with the
task runner that params.yaml asks for. The flow plans everything the run will release and
passes it through the privacy gate (:mod:`dpfair.ledger.gate`) before any MLflow run is opened
or anything trains: checked against ``budget``, then reserved on the people of the data
against ``budget.lifetime_epsilon``. It counts once anything may have been released (a
training task started), and is voided when the flow fails before.
The flow run publishes its results and MLflow link as a Prefect artifact, and the two runs
name each other (:mod:`flows.artifacts`). A method that fails does not lose the others: their
runs are logged, the failure is reported with its error, and the flow ends failed. Runs of
this experiment that a killed process left RUNNING are marked FAILED before the new pipeline
run opens (:func:`dpfair.tracking.runs.fail_stale_runs`), and Prefect temporary servers a killed
run left behind are stopped before this one starts its own (:mod:`flows.server`). A rerun with
the same settings and data resumes the latest pipeline run if it failed: same parent run and
studies, finished searches and trainings read back, not redone (:mod:`dpfair.pipeline.resume`).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Prefect's temporary server takes ~20 s to start on 2 busy cores.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from prefect import flow  # noqa: E402
from prefect.exceptions import TerminationSignal  # noqa: E402
from prefect.futures import PrefectFuture  # noqa: E402

from dpfair.config.params import DEFAULT_PARAMS, Params, load_params  # noqa: E402
from dpfair.config.sections import PipelineSection  # noqa: E402
from dpfair.data import GroupedDataset, source_version  # noqa: E402
from dpfair.errors import DpfairError  # noqa: E402
from dpfair.ledger import DataVersion, PrivacyGate, Release  # noqa: E402
from dpfair.pipeline import method_steps as steps  # noqa: E402
from dpfair.pipeline import release_step  # noqa: E402
from dpfair.pipeline.check_step import check_run  # noqa: E402
from dpfair.pipeline.data_step import PreparedData  # noqa: E402
from dpfair.pipeline.method_steps import RunRecord, TuneRecord  # noqa: E402
from dpfair.pipeline.resume import (  # noqa: E402
    FINGERPRINT_TAG,
    STUDY_TAG,
    Resumable,
    find_resumable,
    fingerprint,
    retry_event,
)
from dpfair.pipeline.summary import Summary  # noqa: E402
from dpfair.processes import request_stop, sigterm_raises  # noqa: E402
from dpfair.release.plan import ReleasePlan, epsilon_text  # noqa: E402
from dpfair.settings import STEPS_LOGGER  # noqa: E402
from dpfair.tracking.run_log import pipeline_run_name  # noqa: E402
from dpfair.tracking.runs import (  # noqa: E402
    add_description,
    existing_experiment,
    experiment_id,
    fail_stale_runs,
    reopen,
    run_url,
)
from dpfair.tracking.runs import run as tracking_run  # noqa: E402
from flows import artifacts  # noqa: E402
from flows.server import api_server_ready, start_api_server  # noqa: E402
from tasks import pipeline as tasks  # noqa: E402

_log = logging.getLogger(__name__)
_step = logging.getLogger(STEPS_LOGGER).info  # one line per step, the CLI shows them


class MethodsFailed(RuntimeError):
    """Some methods failed; the others' results are logged and summarised."""


#: A local Dask cluster's listeners: this machine only, the dashboard on a free port.
LOCAL_ONLY = {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}


def task_runner(pipeline: PipelineSection) -> Any:
    """Threads (default), processes, or Dask (``dask_address``, or a local cluster whose
    scheduler, workers and dashboard listen on 127.0.0.1 only: the dashboard has no login; its
    workers load :mod:`flows.dask_workers`)."""
    if pipeline.task_runner == "processes":
        from prefect.task_runners import ProcessPoolTaskRunner

        return ProcessPoolTaskRunner(max_workers=pipeline.max_workers)
    if pipeline.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        from flows import dask_workers

        if pipeline.dask_address:
            return DaskTaskRunner(address=pipeline.dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": pipeline.max_workers,
                                              "threads_per_worker": 1, **LOCAL_ONLY,
                                              "preload": [dask_workers.__name__]})
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=pipeline.max_workers)


def _collect(futures: dict[Any, PrefectFuture], run: FlowRun) -> dict[Any, Any]:
    """Results of ``futures``; a failed one is recorded under its method label (its error in
    ``run.errors``)."""
    done = {}
    for key, future in futures.items():
        label = key[0] if isinstance(key, tuple) else key
        try:
            done[key] = future.result()
        except Exception as exc:  # one method's failure must not lose the others
            run.failures.setdefault(label, f"{type(exc).__name__}: {exc}")
            run.errors.setdefault(label, exc)
    return done


def _raise_user_error(run: FlowRun) -> None:
    """When every failed method failed on a user error (a ``DpfairError``: bad data or
    settings), raise the first one as it is: the CLI prints it once with its fix and its exit
    code. A bug among them leaves it to ``MethodsFailed``."""
    errors = run.errors
    if errors and all(isinstance(e, DpfairError) for e in errors.values()):
        _log.warning("method(s) %s stopped on the error below (what ran is logged in MLflow "
                     "run %s)", ", ".join(sorted(errors)), run.parent)
        raise errors[min(errors)] from None


@contextmanager
def _after(run: FlowRun, step: str) -> Iterator[None]:
    """Run a step after the trainings. Once methods have failed, its own error is added to
    ``run.notes`` instead of raised, so that it cannot hide theirs (MethodsFailed)."""
    try:
        yield
    except Exception as exc:
        if not run.failures:
            raise
        run.notes.append(f"{step} failed too: {type(exc).__name__}: {exc}")


def gate(params: Params, root: str | Path) -> PrivacyGate:
    """The privacy gate of ``params`` (``budget``; its ledger relative to the project root)."""
    return PrivacyGate(params.budget, root)


@flow(name="dpfair-experiment", flow_run_name=artifacts.flow_run_name)
def experiment_flow(params_path: str = DEFAULT_PARAMS, root: str = ".",
                    resume: bool = True) -> dict[str, Any]:
    """The experiment as its DAG: prepare -> plan -> reserve -> tune -> train x seeds ->
    evaluate -> register -> publish. Resuming, the privacy ledger and failure handling live
    in the steps below (a method's failure is kept in ``run.failures``, never loses the others,
    and ends the flow with :class:`MethodsFailed` once every step has run)."""
    with _stops_on_signal():
        run = prepare(params_path, root, resume)
        _step(f"prepare: {run.prepared.name}, data version {run.data.public_id}")
        plan = plan_release(run)
        with reserve(run, plan) as reserved:
            _step(f"reserve: ε {epsilon_text(reserved.epsilon)} at δ {reserved.delta:g} in the "
                  f"privacy ledger; MLflow parent run {run.parent}")
            tuned = tune(run, plan)
            runs = train(run, plan, tuned)
            _step(f"tune and train: {len(runs)} final runs of {len({r.label for r in runs})} "
                  f"methods" + (f" ({', '.join(run.studies)} searched)" if run.studies else ""))
            summary = evaluate(run, plan, runs)
            registered = register(run, plan, runs)
            publish(run, reserved, summary, registered)
            raise_failures(run)
        return outcome(run, plan, reserved, runs, summary, registered)


@contextmanager
def _stops_on_signal() -> Iterator[None]:
    """Inside a flow run Prefect's SIGTERM handler replaces dpfair's: it raises
    ``TerminationSignal`` in the main thread, and the task runner then waits for its threads.
    Set the process's stop flag then too, so the trainings in those threads stop at their next
    step and no queued one starts (:func:`dpfair.processes.stop_requested`)."""
    try:
        yield
    except TerminationSignal:
        request_stop()
        raise


@dataclass
class FlowRun:
    """What the steps of one flow run share: the (calibrated) params, the prepared data and its
    version in the privacy gate, the crashed run it resumes (``earlier``), the studies; once
    reserved, the MLflow experiment and parent run; the failed methods and later notes."""

    params_path: str
    root: str
    params: Params
    prepared: PreparedData
    dataset: GroupedDataset
    privacy: PrivacyGate
    data: DataVersion
    earlier: Resumable | None
    studies: dict[str, str]
    exp_id: str = ""
    parent: str = ""
    failures: dict[str, str] = field(default_factory=dict)
    errors: dict[str, Exception] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def data_tags(self) -> dict[str, str]:
        return {"dpfair.dataset": self.prepared.name, **self.data.tags()}

    @property
    def out_dir(self) -> Path:
        return Path(self.root) / "outputs" / self.parent


def prepare(params_path: str, root: str, resume: bool) -> FlowRun:
    """Prepare and load the data, calibrate the noise (``budget.calibrate_noise``: every noise
    scaled so that the run's total meets ``budget.epsilon``), identify the data in the privacy
    gate, mark runs a killed process left RUNNING as FAILED, and find the crashed run to resume
    (or name new studies)."""
    params = load_params(params_path)
    tracking, name = params.tracking, params.experiment.dataset
    source = source_version(name, params.dataset(name))
    prepared = tasks.prepare_data(params, root, params_path)
    dataset = tasks.load_data(prepared)
    params = release_step.calibrated_params(params, dataset)
    privacy = gate(params, root)
    data = privacy.identify(name, dataset, params.dataset(name), source, command="dpfair run")
    earlier = None
    if (known := existing_experiment(tracking, prepared.name)) is not None:
        if stale := fail_stale_runs(tracking, known):
            _log.warning("marked FAILED %d run(s) left RUNNING by a killed process: %s",
                         len(stale), ", ".join(stale))
        if resume:
            earlier = find_resumable(tracking, known, params, data.public_id, privacy.ledger)
    if earlier is not None:
        _log.warning("%s", earlier.describe())
        studies = earlier.studies
    else:
        token = uuid.uuid4().hex[:8]
        studies = {label: f"{prepared.name}-{label}-{token}"
                   for label in params.experiment.methods if label in params.tuning.spaces}
    return FlowRun(params_path, root, params, prepared, dataset, privacy, data, earlier, studies)


def plan_release(run: FlowRun) -> ReleasePlan:
    """Every check, then the plan of everything the run releases (a resumed run's retrains
    counted again)."""
    attempts = run.earlier.attempts if run.earlier else {}
    return tasks.plan_release(run.params, run.dataset, run.studies, attempts)


@contextmanager
def reserve(run: FlowRun, plan: ReleasePlan) -> Iterator[Release]:
    """Admit ``plan`` through the privacy gate (over budget or over the lifetime: refused,
    nothing recorded; a resumed run's crashed reservation counts in full and only its retrains
    are reserved on top), open the pipeline's parent run, log the release and the inputs, then
    let the tasks release what the plan covers."""
    earlier = run.earlier
    extra = {} if earlier is None else {"event": retry_event(plan, earlier.attempts),
                                        "resumes": earlier.parent_run_id}
    tracking = run.params.tracking
    with run.privacy.admit(plan, run.data, **extra,
                           **artifacts.prefect_tags()) as spend:
        run.exp_id = experiment_id(tracking, run.prepared.name)
        with _pipeline_run(run, spend.release.id) as parent:
            run.parent = parent
            spend.context["mlflow_run_id"] = parent
            artifacts.tag_flow_run(parent)
            tasks.log_release(tracking, parent, plan)
            if earlier is None:  # a resumed run has them already (same settings, same data)
                tasks.log_inputs(run.params, run.params_path, run.prepared, run.dataset,
                                 tracking, parent)
            spend.may_release()  # from here on, tasks may log what the plan covers
            yield spend.release


def tune(run: FlowRun, plan: ReleasePlan) -> dict[str, TuneRecord]:
    """Every method's search (in parallel), but those a resumed run finished."""
    earlier = run.earlier
    futures = {
        label: tasks.tune_method.submit(run.params, label, run.dataset, run.params.tracking,
                                        run.exp_id, run.parent, run.studies[label],
                                        plan.methods[label])
        for label in run.studies if not (earlier and label in earlier.tuned)
    }
    return {**(earlier.tuned if earlier else {}), **_collect(futures, run)}


def train(run: FlowRun, plan: ReleasePlan, tuned: dict[str, TuneRecord]) -> list[RunRecord]:
    """Every method that has not failed on every seed (in parallel), but the trainings a resumed
    run finished; the records in plan order. None at all: a user error is raised now (nothing
    to summarise)."""
    seeds = run.params.experiment.seeds
    done = run.earlier.trained if run.earlier else {}
    futures = {
        (label, seed): tasks.train_seed.submit(
            steps.final_config(run.params, label, seed, tuned.get(label)), label, run.dataset,
            run.params.tracking, run.exp_id, run.parent, run.data_tags, plan.methods[label],
            tuned.get(label))
        for label in plan.methods if label not in run.failures
        for seed in seeds if (label, seed) not in done
    }
    trained = {**done, **_collect(futures, run)}
    runs = [trained[label, seed] for label in plan.methods for seed in seeds
            if (label, seed) in trained]
    if not runs:
        _raise_user_error(run)
    return runs


def evaluate(run: FlowRun, plan: ReleasePlan, runs: list[RunRecord]) -> Summary | None:
    """The results table and figures, logged to the parent run."""
    summary: Summary | None = None
    with _after(run, "the summary"):
        summary = tasks.evaluate(run.params, run.dataset, runs, run.out_dir, plan)
    with _after(run, "logging the results"):
        tasks.log_results(run.params.tracking, run.parent, summary, run.out_dir, run.failures)
    return summary


def register(run: FlowRun, plan: ReleasePlan, runs: list[RunRecord]) -> dict[str, str] | None:
    """The selected final model in the Model Registry; none once a method failed."""
    if run.failures:
        return None
    return tasks.register_model(run.params, run.params.tracking, run.dataset, runs, plan,
                                run.data_tags, run.parent)


def publish(run: FlowRun, reserved: Release, summary: Summary | None,
            registered: dict[str, str] | None) -> None:
    """The flow run's results artifact: where MLflow has them, the registered model, the
    ledger's spend, the table."""
    params, data = run.params, run.data
    lifetime = params.budget.lifetime_epsilon
    with _after(run, "publishing the results artifact"):
        spent = run.privacy.spent(data, reserved.delta)
        facts = {
            "MLflow run": f"`{run.parent}` (experiment `{run.exp_id}`)",
            "open in MLflow": artifacts.mlflow_link(params.tracking, run.exp_id, run.parent),
            **({"registered model": f"`{registered['name']}` version {registered['version']}"}
               if registered else {}),
            "data": f"{data.source}, version `{data.public_id}`",
            "privacy ledger": f"{_what(reserved)} ε {epsilon_text(reserved.epsilon)}; spent on "
                              f"these people so far ε {epsilon_text(spent)} at δ = "
                              f"{reserved.delta:g}" + (f" (lifetime budget {lifetime:g})"
                                                       if lifetime is not None else ""),
            **({"failed methods": ", ".join(sorted(run.failures))} if run.failures else {}),
        }
        body = (summary.markdown() if summary is not None
                else "No results table: the summary failed.")
        artifacts.publish(artifacts.artifact_key(artifacts.RESULTS_KEY, params.experiment.dataset),
                          f"dpfair results: {data.source}", facts, body)


def raise_failures(run: FlowRun) -> None:
    """End the flow failed when methods failed (the others are logged): as their user error
    when every one failed on one, else with the notes of the steps that failed after them."""
    if run.failures:
        _raise_user_error(run)
        raise MethodsFailed(
            "methods failed (the others are logged in MLflow run "
            f"{run.parent}): " + "; ".join(f"{k}: {v}" for k, v in sorted(run.failures.items()))
            + "".join(f"; {note}" for note in run.notes))


def outcome(run: FlowRun, plan: ReleasePlan, reserved: Release, runs: list[RunRecord],
            summary: Summary | None, registered: dict[str, str] | None) -> dict[str, Any]:
    """What the flow returns: where its runs are, the release, the table."""
    assert summary is not None  # else evaluate raised, or methods failed and MethodsFailed did
    return {
        "experiment_id": run.exp_id,
        "parent_run_id": run.parent,
        "tracking_url": run_url(run.params.tracking, run.exp_id, run.parent),
        "registered_model": registered,
        "data_version": run.data.public_id,
        "ledger_release": reserved.id,
        "table": summary.markdown(),
        "results_dir": str(run.out_dir),
        "figures": summary.figures,
        "runs": [{"label": r.label, "seed": r.seed, "run_id": r.run_id, "epsilon": r.epsilon}
                 for r in runs],
        "release": {"delta": plan.delta, "epsilon_total": plan.epsilon_total,
                    "accountant_total": plan.accountant_total,
                    "total_label": plan.total_label,
                    "epsilon_test_total": plan.epsilon_test_total,
                    "test_delta": plan.test_delta,
                    "methods": {m.label: {"epsilon_run": m.epsilon_run,
                                          "accountant_run": m.accountant_run,
                                          "epsilon_search": m.epsilon_search,
                                          "accountant_search": m.accountant_search,
                                          "epsilon": m.epsilon, "accountant": m.accountant,
                                          "search": m.tuning, "guarantee": m.guarantee}
                                for m in plan.methods.values()}},
    }


@contextmanager
def _pipeline_run(run: FlowRun, ledger_release: str) -> Iterator[str]:
    """The pipeline's parent run: a new one, tagged so that a rerun can find and resume it
    (:mod:`dpfair.pipeline.resume`), or the crashed one, reopened."""
    params, earlier = run.params, run.earlier
    if earlier is not None:
        with reopen(params.tracking, earlier.parent_run_id, tags={
                "dpfair.resumed": earlier.summary(),
                "dpfair.ledger_release_resumed": ledger_release,
                **artifacts.prefect_tags()}) as parent:
            yield parent
            add_description(params.tracking, parent, earlier.describe())  # after the summary's
        return
    tags = {**run.data_tags, "dpfair.stage": "pipeline", **artifacts.prefect_tags(),
            "dpfair.ledger_release": ledger_release, FINGERPRINT_TAG: fingerprint(params),
            **{f"{STUDY_TAG}{label}": name for label, name in run.studies.items()}}
    with tracking_run(params.tracking, run.exp_id, pipeline_run_name(run.prepared.name),
                      tags=tags) as parent:
        yield parent


def _what(reserved: Release) -> str:
    """What the ledger release of this flow run is: the run's, or what resuming added."""
    resumed = reserved.context.get("resumes")
    return f"resuming run {resumed} added" if resumed else "this run"


def _share_cores(workers: int) -> None:
    """Give each of ``workers`` concurrent trainings its share of the cores: more torch threads
    than free cores makes OpenMP wait on descheduled peers (benchmarks/results/step_speed.md)."""
    import torch

    threads = max(1, (os.cpu_count() or 1) // workers)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for process and Dask workers


def run_experiment(params_path: str = DEFAULT_PARAMS, root: str = ".",
                   resume: bool = True, checked: bool = False) -> dict[str, Any]:
    """Validate params.yaml and what it declares (:func:`dpfair.pipeline.check_step.check_run`: the
    data, groups, search space and model; skipped when ``checked`` says the caller ran it), a
    DpfairError before any work, then run the flow. SIGTERM
    ends it as an exception (Prefect's handler inside the flow, :func:`sigterm_raises`
    around it): the pipeline run ends FAILED, the trainings in progress stop at their next
    step and end FAILED, none queued starts, and the temporary Prefect server stops at exit
    (:mod:`flows.server`)."""
    params = load_params(params_path)
    if not checked:
        check_run(params)
    with sigterm_raises():
        start_api_server()  # in the background (unless started, or an API is configured)
        _share_cores(params.pipeline.max_workers)
        configured = experiment_flow.with_options(task_runner=task_runner(params.pipeline))
        api_server_ready()
        return configured(params_path=str(Path(params_path).resolve()),
                          root=str(Path(root).resolve()), resume=resume)
