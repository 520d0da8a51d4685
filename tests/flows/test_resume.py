"""A rerun resumes a failed or killed pipeline run (:mod:`dpfair.pipeline.resume`): same parent
run and study, finished searches and trainings read back instead of redone, and every earlier
attempt of a retrained training counted again in the ε and the privacy ledger (issue #15,
item 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dp_accounting import dp_event
from mlflow import MlflowClient

from dpfair import accounting
from dpfair.config.params import load_params
from dpfair.data import load_dataset
from dpfair.ledger import SourceLedger
from dpfair.pipeline.resume import find_resumable
from dpfair.tracking.runs import read_results
from dpfair.training import make_plan
from tests.conftest import epsilon_oracle
from tests.flows.conftest import SMALL_EXPERIMENT, fail_training_of, final_runs, make_workspace

pytestmark = pytest.mark.slow


def _oracle(event: dp_event.DpEvent, delta: float) -> float:
    return epsilon_oracle(event, delta=delta)


def _counting(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` by a wrapper that records each call's first argument."""
    real, calls = getattr(module, name), []

    def wrapper(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def _run_event(params_path: Path, label: str, seed: int) -> dp_event.DpEvent:
    params = load_params(params_path)
    config = params.experiment.train_config(label, seed)
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    return make_plan(config, len(dataset.train), dataset.n_groups).event


def test_rerun_after_a_failed_method_resumes_it(prefect_harness, tmp_path, repo_root,
                                                monkeypatch):
    from dpfair.pipeline import method_steps
    from flows.experiment import MethodsFailed, run_experiment

    monkeypatch.chdir(tmp_path)
    tuning = {"mode": "fixed", "n_runs": 2, "spaces": {"dpsgd": {"lr": [0.2, 0.5]}}}
    params_path = make_workspace(tmp_path, repo_root, SMALL_EXPERIMENT, tuning)
    real_train = method_steps.train
    fail_training_of(monkeypatch, "dpsgd_global")
    with pytest.raises(MethodsFailed, match="dpsgd_global"):
        run_experiment(str(params_path), str(tmp_path))
    params = load_params(params_path)
    client = MlflowClient(params.tracking.uri)
    [crashed] = client.search_runs(
        [client.get_experiment_by_name("dpfair-synthetic").experiment_id],
        "tags.`dpfair.stage` = 'pipeline'")
    assert crashed.info.status == "FAILED"

    monkeypatch.setattr(method_steps, "train", real_train)
    trained = _counting(monkeypatch, method_steps, "train")
    searched = _counting(monkeypatch, method_steps, "tune")
    out = run_experiment(str(params_path), str(tmp_path))

    # the same pipeline run and study, finished; only the failed method trained again
    assert out["parent_run_id"] == crashed.info.run_id
    parent = client.get_run(crashed.info.run_id)
    assert parent.info.status == "FINISHED"
    assert json.loads(parent.data.tags["dpfair.resumed"])["retrains"] == [
        ["dpsgd_global", 0], ["dpsgd_global", 1]]  # a tag holds JSON, the words its description
    assert "retrains dpsgd_global seed 0, dpsgd_global seed 1" in parent.data.tags[
        "mlflow.note.content"]
    assert searched == []  # dpsgd's search finished: its selection was read back
    assert sorted((c.method.name, c.seed) for c in trained) == [("dpsgd_global", 0),
                                                                ("dpsgd_global", 1)]
    assert {(r["label"], r["seed"]) for r in out["runs"]} == {
        (label, seed) for label in ("nonprivate", "dpsgd", "dpsgd_global") for seed in (0, 1)}
    runs = client.search_runs([out["experiment_id"]], max_results=1000)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    finals = [r for r in runs if r.data.tags.get("dpfair.stage") == "final"]
    assert len(finals) == 8  # 6 finished + 2 failed attempts, kept
    assert read_results(params.tracking) == (out["parent_run_id"], out["table"])

    # each failed attempt may have released per-epoch metrics: it counts again
    delta = out["release"]["delta"]
    event = _run_event(params_path, "dpsgd_global", 0)
    assert out["release"]["methods"]["dpsgd_global"]["epsilon"] == pytest.approx(
        _oracle(dp_event.SelfComposedDpEvent(event, 4), delta), rel=1e-4)
    first, resumed = SourceLedger(params.budget.ledger, tmp_path).releases("synthetic")
    assert first.status == "failed" and resumed.status == "released"  # failed: it counts
    assert resumed.context["resumes"] == crashed.info.run_id
    assert resumed.epsilon == pytest.approx(
        _oracle(dp_event.SelfComposedDpEvent(event, 2), delta), rel=1e-4)
    assert "2 crashed attempt(s) retrained" in parent.data.tags["mlflow.note.content"]
    # a finished run is not resumed: the next rerun would start afresh
    exp_id = out["experiment_id"]
    book = SourceLedger(params.budget.ledger, tmp_path)
    assert find_resumable(params.tracking, exp_id, params, parent.data.tags[
        "dpfair.data_version"], book) is None


def test_rerun_after_a_failed_search_reopens_its_study(prefect_harness, tmp_path, repo_root,
                                                       monkeypatch):
    """K is drawn once per study: the resumed search must reopen the crashed run's study,
    never open a new one (a fresh draw of K would let a rerun choose among draws)."""
    import optuna

    from dpfair.pipeline import method_steps
    from flows.experiment import MethodsFailed, run_experiment

    monkeypatch.chdir(tmp_path)
    tuning = {"mode": "fixed", "n_runs": 2, "spaces": {"dpsgd": {"lr": [0.2, 0.5]}}}
    small = {**SMALL_EXPERIMENT, "seeds": [0], "methods": {"dpsgd": {"C": 1.0}}}
    params_path = make_workspace(tmp_path, repo_root, small, tuning)
    real_tune, studies = method_steps.tune, []

    def crashing_tune(method, base, dataset, cfg):
        studies.append(cfg.study_name)
        raise RuntimeError("the search crashed")

    monkeypatch.setattr(method_steps, "tune", crashing_tune)
    with pytest.raises(MethodsFailed, match="the search crashed"):
        run_experiment(str(params_path), str(tmp_path))

    def recording_tune(method, base, dataset, cfg):
        studies.append(cfg.study_name)
        return real_tune(method, base, dataset, cfg)

    monkeypatch.setattr(method_steps, "tune", recording_tune)
    out = run_experiment(str(params_path), str(tmp_path))
    assert len(studies) == 2 and studies[0] == studies[1]
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == [studies[0]]
    assert {(r["label"], r["seed"]) for r in out["runs"]} == {("nonprivate", 0), ("dpsgd", 0)}
    # the crashed search's MLflow run was reopened and finished: one run per search
    searches = MlflowClient(load_params(params_path).tracking.uri).search_runs(
        [out["experiment_id"]], "tags.`dpfair.stage` = 'tuning'")
    assert [r.info.status for r in searches] == ["FINISHED"]


_KILLED_RUN = """
import sys, time
from dpfair.pipeline import method_steps
real = method_steps.train
def train(config, dataset, callbacks=()):
    if config.method.name == "dpsgd":
        time.sleep(600)  # killed here
    return real(config, dataset, callbacks)
method_steps.train = train
from flows.experiment import run_experiment
run_experiment(*sys.argv[1:])
"""


def test_kill_9_after_one_training_then_rerun_resumes(prefect_api, tmp_path, repo_root,
                                                      monkeypatch):
    from dpfair.pipeline import method_steps
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    small = {**SMALL_EXPERIMENT, "seeds": [0], "methods": {"dpsgd": {"C": 1.0}}}
    params_path = make_workspace(tmp_path, repo_root, small,
                                 pipeline={"max_workers": 1})
    # the killed run reports to the session's server (test_crash.py kills temporary ones)
    env = {**os.environ, "PREFECT_API_URL": prefect_api,
           "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(params_path),
                             str(tmp_path)], cwd=tmp_path, env=env)
    deadline = time.monotonic() + 300
    wanted = {("nonprivate", "FINISHED"), ("dpsgd", "RUNNING")}
    while not wanted <= final_runs(tmp_path / "mlflow.db"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the trainings did not reach the kill point (exit {proc.wait()})")
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)

    trained = _counting(monkeypatch, method_steps, "train")
    out = run_experiment(str(params_path), str(tmp_path))
    assert [(c.method.name, c.seed) for c in trained] == [("dpsgd", 0)]
    client = MlflowClient(load_params(params_path).tracking.uri)
    runs = client.search_runs([out["experiment_id"]], max_results=1000)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    assert len([r for r in runs if r.data.tags.get("dpfair.stage") == "pipeline"]) == 1
    killed = [r for r in runs if r.data.tags.get("dpfair.method") == "dpsgd"
              and r.info.status == "FAILED"]
    assert len(killed) == 1 and "dpfair.stale" in killed[0].data.tags
    params = load_params(params_path)
    [first, resumed] = SourceLedger(params.budget.ledger, tmp_path).releases("synthetic")
    assert first.status == "pending"  # killed: counts in full, whatever it released
    assert resumed.epsilon == pytest.approx(
        accounting.epsilon(_run_event(params_path, "dpsgd", 0), out["release"]["delta"]),
        rel=1e-9)
