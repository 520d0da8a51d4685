"""The experiment's Prefect tasks. Retries only where a retry is safe: preparing data, writing
the summary, logging the inputs and registering the selected model (idempotent per run), and
only for a failure that may pass (:func:`may_pass`: never bad data or settings, which fail the
same way again). Never on planning the release (it prepares the searches, drawing K), on
tuning or on training: a DP run whose output may already have been released would spend
privacy twice."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from dpfair.errors import DpfairError, UnreachableError
from dpfair.pipeline import data_step, method_steps, release_step, summary


def may_pass(task: object, task_run: object, state: State) -> bool:
    """Prefect's retry condition: retry an unreachable service or an unexpected error, never a
    user error (a ``DpfairError`` naming bad data or settings: a retry fails the same way)."""
    error = state.data if isinstance(state.data, BaseException) else None
    return not isinstance(error, DpfairError) or isinstance(error, UnreachableError)


_RETRY = {"retries": 2, "retry_delay_seconds": 2, "retry_condition_fn": may_pass}

prepare_data = task(data_step.prepare_data, name="prepare_data", **_RETRY,
                    cache_policy=NO_CACHE)
load_data = task(data_step.load_data, name="load_data", cache_policy=NO_CACHE)
plan_release = task(release_step.plan_release, name="plan_release", retries=0,
                    cache_policy=NO_CACHE)
tune_method = task(method_steps.tune_method, name="tune_method", retries=0, cache_policy=NO_CACHE)
train_seed = task(method_steps.train_and_log, name="train_seed", retries=0, cache_policy=NO_CACHE,
                  task_run_name="train {label} seed {config.seed}")
evaluate = task(summary.summarise, name="evaluate", cache_policy=NO_CACHE)
log_release = task(summary.log_release, name="log_release", **_RETRY, cache_policy=NO_CACHE)
log_results = task(summary.log_summary, name="log_results", **_RETRY, cache_policy=NO_CACHE)
log_inputs = task(data_step.log_pipeline_inputs, name="log_inputs", **_RETRY,
                  cache_policy=NO_CACHE)
register_model = task(summary.register_model, name="register_model", **_RETRY,
                      cache_policy=NO_CACHE)
