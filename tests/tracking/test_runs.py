"""MLflow helpers: metric keys MLflow accepts, flattened params, and the clean-up after a
killed process (runs left RUNNING are marked FAILED; results read only finished runs)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

from dpfair.tracking.runs import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    TrackingConfig,
    experiment_id,
    fail_stale_runs,
    flatten,
    log_metrics,
    log_text,
    metric_key,
    read_results,
    run,
    run_url,
)
from tests.tracking.conftest import killed_run


def test_metric_key_keeps_allowed_and_spells_out_comparisons():
    assert metric_key("test/class_accuracy/<=50K") == "test/class_accuracy/le 50K"
    assert metric_key("test/class_accuracy/>50K") == "test/class_accuracy/gt 50K"
    assert metric_key("test/class_accuracy/low (5_4_9)") == "test/class_accuracy/low 5_4_9"
    assert metric_key("final/test/group_accuracy/F & non-white") == (
        "final/test/group_accuracy/F non-white")
    assert metric_key("test/group_accuracy/w × Ost") == "test/group_accuracy/w x Ost"


def test_logged_metrics_with_dataset_names_reach_mlflow(tmp_path):
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'm.db'}",
                         artifact_root=str(tmp_path / "art"))
    client = MlflowClient(cfg.uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with run(cfg, exp, "r") as run_id:
        log_metrics(cfg, run_id, {"acc/<=50K": 0.5, "acc/low (5_4_9)": 0.25,
                                  "skipped": float("nan")})
    metrics = client.get_run(run_id).data.metrics
    assert metrics == {"acc/le 50K": 0.5, "acc/low 5_4_9": 0.25}


def test_group_names_that_are_no_safe_key_reach_mlflow_under_distinct_keys(tmp_path):
    """Group values with '/', '..', nothing left after cleaning, or two cleaning to the same
    key each get one distinct key MLflow accepts (they failed after training before); the
    names are kept in the run's ``dpfair.metric_keys`` tag."""
    from dpfair.data import load_dataset
    from dpfair.metric_keys import metric_segments
    from dpfair.tracking.run_log import log_data_input
    from dpfair.training import flat_metrics

    names = ["a/b", "..", "/", "a b", "", "<=50K", "ok"]
    assert metric_segments(names) == ["a b", "id 1", "id 2", "a b id 3", "id 4", "le 50K",
                                      "ok"]
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'm.db'}",
                         artifact_root=str(tmp_path / "art"))
    client = MlflowClient(cfg.uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    values = [0.1 * (k + 1) for k in range(len(names))]
    flat = flat_metrics({"group_accuracy": values}, "final/test/", group_names=names)
    dataset = dataclasses.replace(load_dataset("synthetic", {"n": 200}), group_names=names)
    with run(cfg, exp, "r") as run_id:
        log_metrics(cfg, run_id, flat)
        log_data_input(cfg, run_id, dataset, "v", "synthetic")
    data = client.get_run(run_id).data
    assert len(data.metrics) == len(names)
    assert data.metrics["final/test/group_accuracy/id 1"] == pytest.approx(0.2)
    assert data.metrics["final/test/group_accuracy/a b id 3"] == pytest.approx(0.4)
    kept = json.loads(data.tags["dpfair.metric_keys"])
    assert kept["id 1"] == ".." and kept["a b"] == "a/b" and "ok" not in kept
    assert metric_key("x/../y//z") == "x/_/y/_/z"


def test_flatten_nested_params():
    assert flatten({"a": {"b": 1, "c": {"d": "x"}}, "e": [1, 2]}) == {
        "a.b": "1", "a.c.d": "x", "e": "[1, 2]"}


def test_unset_options_are_no_params():
    assert flatten({"a": {"b": None, "c": 0}, "d": None, "e": "None"}) == {"a.c": "0",
                                                                           "e": "None"}


def test_experiments_open_on_their_runs_in_the_ui(tmp_path):
    """MLflow 3's UI opens an experiment by its kind tag: new experiments get it, and so does
    one created before dpfair set it."""
    cfg = _cfg(tmp_path)
    client = MlflowClient(cfg.uri)
    older = client.create_experiment("dpfair-older")
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(older).tags
    for dataset in ("older", "new"):
        exp = experiment_id(cfg, dataset)
        assert client.get_experiment(exp).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert experiment_id(cfg, "older") == older
    assert run_url(cfg, older, "abc") == f"http://127.0.0.1:5000/#/experiments/{older}/runs/abc"
    remote = TrackingConfig(uri="https://mlflow.example.org/")
    assert run_url(remote, "1", "abc") == "https://mlflow.example.org/#/experiments/1/runs/abc"



def _cfg(tmp_path) -> TrackingConfig:
    return TrackingConfig(uri=f"sqlite:///{tmp_path / 'm.db'}",
                          artifact_root=str(tmp_path / "art"))


def test_runs_left_running_by_a_killed_process_are_marked_failed(tmp_path):
    cfg = _cfg(tmp_path)
    client = MlflowClient(cfg.uri)
    exp = experiment_id(cfg, "synthetic")
    killed = killed_run(cfg, exp)
    assert client.get_run(killed).info.status == "RUNNING"
    other_host = client.create_run(exp, tags={"dpfair.host": "elsewhere",
                                              "dpfair.pid": "1"}).info.run_id
    with run(cfg, exp, "live") as live:
        assert fail_stale_runs(cfg, exp) == [killed]
        assert client.get_run(live).info.status == "RUNNING"  # its process is alive
    failed = client.get_run(killed)
    assert failed.info.status == "FAILED" and failed.info.end_time is not None
    assert json.loads(failed.data.tags["dpfair.stale"])["pid"] > 0  # machine-readable
    assert "died while this run was RUNNING" in failed.data.tags["mlflow.note.content"]
    assert client.get_run(other_host).info.status == "RUNNING"  # unknowable: left alone
    assert fail_stale_runs(cfg, exp) == []


def test_run_records_its_host_and_pid(tmp_path):
    cfg = _cfg(tmp_path)
    exp = experiment_id(cfg, "synthetic")
    with run(cfg, exp, "r") as run_id:
        pass
    tags = MlflowClient(cfg.uri).get_run(run_id).data.tags
    assert tags["dpfair.host"] == socket.gethostname() and tags["dpfair.pid"] == str(os.getpid())


def test_results_reads_the_latest_finished_pipeline_run(tmp_path):
    cfg = _cfg(tmp_path)
    exp = experiment_id(cfg, "synthetic")
    with run(cfg, exp, "pipeline:synthetic", tags={"dpfair.stage": "pipeline"}) as finished:
        log_text(cfg, finished, "| table |\n", "results/results.md")
    time.sleep(0.01)  # a later start time
    killed = killed_run(cfg, exp)
    assert read_results(cfg) == (finished, "| table |\n")
    fail_stale_runs(cfg, exp)
    assert read_results(cfg) == (finished, "| table |\n")
    assert MlflowClient(cfg.uri).get_run(killed).info.status == "FAILED"


def test_results_without_a_finished_run_is_a_clear_error(tmp_path):
    cfg = _cfg(tmp_path)
    killed_run(cfg, experiment_id(cfg, "synthetic"))
    with pytest.raises(LookupError, match="no finished pipeline run.*--run-id"):
        read_results(cfg)


# SIGTERM sent from inside a call of the tracking store, mid-transaction (the moment the
# INSERT of its metrics reaches SQLite), by SQLAlchemy's own event hook; in a fresh Python,
# since sigterm_raises sets the process's stop flag.
_SIGTERM_IN_A_CALL = """
import json, os, signal, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine
from dpfair.errors import Terminated
from dpfair.processes import sigterm_raises
from dpfair.tracking.runs import TrackingConfig, client, experiment_id, log_metrics
cfg = TrackingConfig(uri=f"sqlite:///{sys.argv[1]}/m.db", artifact_root=f"{sys.argv[1]}/art")
mlf = client(cfg)
run_id = mlf.create_run(experiment_id(cfg, "x")).info.run_id
sent = []

@event.listens_for(Engine, "before_cursor_execute")
def _kill(conn, cursor, statement, *args):
    if statement.startswith("INSERT INTO metrics") and not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGTERM)

ended = "no Terminated"
try:
    with sigterm_raises():
        log_metrics(cfg, run_id, {"a": 1.0, "b": 2.0})
        ended = "after the call"
except Terminated:
    ended = "raised by log_metrics"
mlf.set_terminated(run_id, status="FAILED")  # waits for the lock if the call left one
run = mlf.get_run(run_id)
print(json.dumps([sent, ended, run.data.metrics, run.info.status]))
"""


def test_a_sigterm_waits_for_the_tracking_call_it_arrives_in(tmp_path):
    """The SIGTERM that arrives inside a write to the store is raised when the write ends: its
    metrics are stored, the store is not left locked, and the run ends FAILED at once."""
    done = subprocess.run([sys.executable, "-c", _SIGTERM_IN_A_CALL, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    sent, ended, metrics, status = json.loads(done.stdout.strip().splitlines()[-1])
    assert sent == [True] and ended == "raised by log_metrics"
    assert metrics == {"a": 1.0, "b": 2.0} and status == "FAILED"
