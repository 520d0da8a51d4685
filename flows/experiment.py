"""The experiment flow: prepare -> plan the release -> tune -> train x
seeds -> report.

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
run opens (:func:`dpfair.tracking.fail_stale_runs`), and Prefect temporary servers a killed
run left behind are stopped before this one starts its own (:mod:`flows.server`). A rerun with
the same settings and data resumes the latest pipeline run if it failed: same parent run and
studies, finished searches and trainings read back, not redone (:mod:`dpfair.resume`).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Prefect's temporary server takes ~20 s to start on 2 busy cores.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow  # noqa: E402
from prefect.futures import PrefectFuture  # noqa: E402

from dpfair import experiment as steps  # noqa: E402
from dpfair.checks import check_run  # noqa: E402
from dpfair.config import DEFAULT_PARAMS, Params, load_params  # noqa: E402
from dpfair.data import source_version  # noqa: E402
from dpfair.errors import DpfairError  # noqa: E402
from dpfair.ledger import DataVersion, PrivacyGate, Release  # noqa: E402
from dpfair.processes import sigterm_raises  # noqa: E402
from dpfair.release import epsilon_text  # noqa: E402
from dpfair.resume import (  # noqa: E402
    FINGERPRINT_TAG,
    STUDY_TAG,
    Resumable,
    find_resumable,
    fingerprint,
    retry_event,
)
from dpfair.run_log import pipeline_run_name  # noqa: E402
from dpfair.sections import PipelineSection  # noqa: E402
from dpfair.summary import Summary  # noqa: E402
from dpfair.tracking import (  # noqa: E402
    existing_experiment,
    experiment_id,
    fail_stale_runs,
    reopen,
    run,
    run_url,
)
from flows import artifacts  # noqa: E402
from flows.server import mark_owner, one_api_server, stop_orphan_servers  # noqa: E402
from tasks.pipeline import (  # noqa: E402
    evaluate,
    load_data,
    log_inputs,
    log_release,
    log_results,
    plan_release,
    prepare_data,
    register_model,
    train_seed,
    tune_method,
)

_log = logging.getLogger(__name__)


class MethodsFailed(RuntimeError):
    """Some methods failed; the others' results are logged and summarised."""


#: A local Dask cluster's listeners: this machine only, the dashboard on a free port.
LOCAL_ONLY = {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}


def task_runner(pipeline: PipelineSection) -> Any:
    """Threads (default), processes, or Dask (``dask_address``, or a local cluster whose
    scheduler, workers and dashboard listen on 127.0.0.1 only: the dashboard has no login)."""
    if pipeline.task_runner == "processes":
        from prefect.task_runners import ProcessPoolTaskRunner

        return ProcessPoolTaskRunner(max_workers=pipeline.max_workers)
    if pipeline.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if pipeline.dask_address:
            return DaskTaskRunner(address=pipeline.dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": pipeline.max_workers,
                                              "threads_per_worker": 1, **LOCAL_ONLY})
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=pipeline.max_workers)


def _collect(futures: dict[Any, PrefectFuture], failures: dict[str, str],
             errors: dict[str, Exception]) -> dict[Any, Any]:
    """Results of ``futures``; a failed one is recorded under its method label (its error in
    ``errors``)."""
    done = {}
    for key, future in futures.items():
        label = key[0] if isinstance(key, tuple) else key
        try:
            done[key] = future.result()
        except Exception as exc:  # one method's failure must not lose the others
            failures.setdefault(label, f"{type(exc).__name__}: {exc}")
            errors.setdefault(label, exc)
    return done


def _raise_user_error(errors: dict[str, Exception], parent: str) -> None:
    """When every failed method failed on a user error (a ``DpfairError``: bad data or
    settings), raise the first one as it is: the CLI prints it once with its fix and its exit
    code. A bug among them leaves it to ``MethodsFailed``."""
    if errors and all(isinstance(e, DpfairError) for e in errors.values()):
        _log.warning("method(s) %s stopped on the error below (what ran is logged in MLflow "
                     "run %s)", ", ".join(sorted(errors)), parent)
        raise errors[min(errors)] from None


@contextmanager
def _after(failures: dict[str, str], step: str, notes: list[str]) -> Iterator[None]:
    """Run a step after the trainings. Once methods have failed, its own error is added to
    ``notes`` instead of raised, so that it cannot hide theirs (MethodsFailed)."""
    try:
        yield
    except Exception as exc:
        if not failures:
            raise
        notes.append(f"{step} failed too: {type(exc).__name__}: {exc}")


def gate(params: Params, root: str | Path) -> PrivacyGate:
    """The privacy gate of ``params`` (``budget``; its ledger relative to the project root)."""
    return PrivacyGate(params.budget, root)


@flow(name="dpfair-experiment", flow_run_name=artifacts.flow_run_name)
def experiment_flow(params_path: str = DEFAULT_PARAMS, root: str = ".",
                    resume: bool = True) -> dict[str, Any]:
    params: Params = load_params(params_path)
    exp, tracking = params.experiment, params.tracking
    source = source_version(exp.dataset, params.dataset(exp.dataset))
    prepared = prepare_data(params, root, params_path)
    dataset = load_data(prepared)
    # budget.calibrate_noise: every noise scaled so that the run's total meets budget.epsilon
    params = steps.calibrated_params(params, dataset)
    exp = params.experiment
    privacy = gate(params, root)
    data = privacy.identify(exp.dataset, dataset, params.dataset(exp.dataset), source)
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
                   for label in exp.methods if label in params.tuning.spaces}
    attempts = earlier.attempts if earlier else {}
    plan = plan_release(params, dataset, studies, attempts)  # every check, then the plan
    # over budget or over the lifetime: refused, nothing recorded. A resumed run's crashed
    # reservation counts in full; only its retrains are reserved on top
    extra = {} if earlier is None else {"event": retry_event(plan, attempts),
                                        "resumes": earlier.parent_run_id}
    with privacy.admit(plan, data, **extra, **artifacts.prefect_tags()) as spend:
        reserved = spend.release
        exp_id = experiment_id(tracking, prepared.name)
        data_tags = {"dpfair.dataset": prepared.name, "dpfair.data_version": data.public_id}
        failures: dict[str, str] = {}
        errors: dict[str, Exception] = {}
        with _pipeline_run(params, prepared.name, exp_id, data_tags, studies, reserved.id,
                           earlier) as parent:
            spend.context["mlflow_run_id"] = parent
            artifacts.tag_flow_run(parent)
            log_release(tracking, parent, plan)
            if earlier is None:  # a resumed run has them already (same settings, same data)
                log_inputs(params, params_path, prepared, dataset, tracking, parent)
            spend.may_release()  # from here on, tasks may log what the plan covers
            tune_futures = {
                label: tune_method.submit(params, label, dataset, tracking, exp_id, parent,
                                          studies[label], plan.methods[label])
                for label in studies if not (earlier and label in earlier.tuned)
            }
            tuned = {**(earlier.tuned if earlier else {}),
                     **_collect(tune_futures, failures, errors)}
            done = earlier.trained if earlier else {}
            train_futures = {
                (label, seed): train_seed.submit(
                    steps.final_config(params, label, seed, tuned.get(label)), label, dataset,
                    tracking, exp_id, parent, data_tags, plan.methods[label], tuned.get(label))
                for label in plan.methods if label not in failures
                for seed in exp.seeds if (label, seed) not in done
            }
            trained = {**done, **_collect(train_futures, failures, errors)}
            runs = [trained[label, seed] for label in plan.methods for seed in exp.seeds
                    if (label, seed) in trained]
            if not runs:  # nothing to summarise: a user error is raised now
                _raise_user_error(errors, parent)
            out_dir = Path(root) / "outputs" / parent
            summary: Summary | None = None
            later: list[str] = []
            with _after(failures, "the summary", later):
                summary = evaluate(params, dataset, runs, out_dir, plan)
            with _after(failures, "logging the results", later):
                log_results(tracking, parent, summary, out_dir, failures)
            registered = None if failures else register_model(params, tracking, dataset, runs,
                                                               plan, data_tags, parent)
            with _after(failures, "publishing the results artifact", later):
                _publish(params, privacy, data, reserved, exp_id, parent, summary, failures,
                         registered)
            if failures:
                _raise_user_error(errors, parent)
                raise MethodsFailed(
                    "methods failed (the others are logged in MLflow run "
                    f"{parent}): " + "; ".join(f"{k}: {v}" for k, v in sorted(failures.items()))
                    + "".join(f"; {note}" for note in later))
    assert summary is not None  # else evaluate raised, or methods failed and MethodsFailed did
    return {
        "experiment_id": exp_id,
        "parent_run_id": parent,
        "tracking_url": run_url(tracking, exp_id, parent),
        "registered_model": registered,
        "data_version": data.public_id,
        "ledger_release": reserved.id,
        "table": summary.markdown(),
        "results_dir": str(out_dir),
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
def _pipeline_run(params: Params, dataset: str, exp_id: str, data_tags: dict[str, str],
                  studies: dict[str, str], ledger_release: str,
                  earlier: Resumable | None) -> Iterator[str]:
    """The pipeline's parent run: a new one, tagged so that a rerun can find and resume it
    (:mod:`dpfair.resume`), or the crashed one, reopened."""
    if earlier is not None:
        with reopen(params.tracking, earlier.parent_run_id, tags={
                "dpfair.resumed": earlier.describe(),
                "dpfair.ledger_release_resumed": ledger_release,
                **artifacts.prefect_tags()}) as parent:
            yield parent
        return
    tags = {**data_tags, "dpfair.stage": "pipeline", **artifacts.prefect_tags(),
            "dpfair.ledger_release": ledger_release, FINGERPRINT_TAG: fingerprint(params),
            **{f"{STUDY_TAG}{label}": name for label, name in studies.items()}}
    with run(params.tracking, exp_id, pipeline_run_name(dataset), tags=tags) as parent:
        yield parent


def _publish(params: Params, privacy: PrivacyGate, data: DataVersion, reserved: Release,
             exp_id: str, parent: str, summary: Summary | None, failures: dict[str, str],
             registered: dict[str, str] | None) -> None:
    """The flow run's results artifact: where MLflow has them, the registered model, the
    ledger's spend, the table."""
    source, version = data.source, data.public_id
    spent = privacy.spent(data, reserved.delta)
    lifetime = params.budget.lifetime_epsilon
    facts = {
        "MLflow run": f"`{parent}` (experiment `{exp_id}`)",
        "open in MLflow": artifacts.mlflow_link(params.tracking, exp_id, parent),
        **({"registered model": f"`{registered['name']}` version {registered['version']}"}
           if registered else {}),
        "data": f"{source}, version `{version}`",
        "privacy ledger": f"{_what(reserved)} ε {epsilon_text(reserved.epsilon)}; spent on "
                          f"these people so far ε {epsilon_text(spent)} at δ = "
                          f"{reserved.delta:g}" + (f" (lifetime budget {lifetime:g})"
                                                   if lifetime is not None else ""),
        **({"failed methods": ", ".join(sorted(failures))} if failures else {}),
    }
    body = summary.markdown() if summary is not None else "No results table: the summary failed."
    artifacts.publish(artifacts.artifact_key(artifacts.RESULTS_KEY, params.experiment.dataset),
                      f"dpfair results: {source}", facts, body)


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
    """Validate params.yaml and what it declares (:func:`dpfair.checks.check_run`: the data,
    groups, search space and model; skipped when ``checked`` says the caller ran it), a
    DpfairError before any work, then run the flow. SIGTERM
    ends it as an exception (Prefect's handler inside the flow, :func:`sigterm_raises`
    around it): the pipeline run ends FAILED, the trainings in progress finish and are logged
    before the process exits, and Prefect stops its temporary server (:mod:`flows.server`)."""
    params = load_params(params_path)
    if not checked:
        check_run(params)
    if orphans := stop_orphan_servers():
        _log.warning("stopped Prefect temporary server(s) left by a killed run: pids %s",
                     ", ".join(map(str, orphans)))
    mark_owner()
    _share_cores(params.pipeline.max_workers)
    configured = experiment_flow.with_options(task_runner=task_runner(params.pipeline))
    with sigterm_raises(), one_api_server(params.pipeline.task_runner == "dask"):
        return configured(params_path=str(Path(params_path).resolve()),
                          root=str(Path(root).resolve()), resume=resume)
