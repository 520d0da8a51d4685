"""The experiment's Prefect tasks. Retries only where a retry is safe: preparing data, writing
the summary, logging the inputs and registering the selected model (idempotent per run). Never
on planning the release (it prepares the searches, drawing K), on tuning or on training: a DP
run whose output may already have been released would spend privacy twice."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from dpfair import experiment, pipeline_data, summary

prepare_data = task(pipeline_data.prepare_data, name="prepare_data", retries=2,
                    retry_delay_seconds=2, cache_policy=NO_CACHE)
load_data = task(pipeline_data.load_data, name="load_data", cache_policy=NO_CACHE)
plan_release = task(experiment.plan_release, name="plan_release", retries=0,
                    cache_policy=NO_CACHE)
tune_method = task(experiment.tune_method, name="tune_method", retries=0, cache_policy=NO_CACHE)
train_seed = task(experiment.train_and_log, name="train_seed", retries=0, cache_policy=NO_CACHE,
                  task_run_name="train {label} seed {config.seed}")
evaluate = task(summary.summarise, name="evaluate", cache_policy=NO_CACHE)
log_release = task(summary.log_release, name="log_release", retries=2, retry_delay_seconds=2,
                   cache_policy=NO_CACHE)
log_results = task(summary.log_summary, name="log_results", retries=2,
                   retry_delay_seconds=2, cache_policy=NO_CACHE)
log_inputs = task(pipeline_data.log_pipeline_inputs, name="log_inputs", retries=2,
                  retry_delay_seconds=2, cache_policy=NO_CACHE)
register_model = task(summary.register_model, name="register_model", retries=2,
                      retry_delay_seconds=2, cache_policy=NO_CACHE)
