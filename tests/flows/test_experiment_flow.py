"""The experiment flow end to end under Prefect, asserting on what MLflow holds: only what
the reported ε covers, and a total that is dp_accounting's composition of every release."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from dp_accounting import dp_event
from mlflow import MlflowClient

from dpfair import accounting
from dpfair.config.params import ConfigError, load_params
from dpfair.data import data_version, load_dataset, source_version
from dpfair.errors import PrivacyError
from dpfair.release.labels import (
    EPSILON_METHOD,
    EPSILON_RUN,
    HEURISTIC,
    NO_NOISE,
    NONPRIVATE_REFERENCE,
    PRIVATE_LEDGER_STATUS,
    SECRET_NOISE,
    TEST_METRICS_NOTE,
)
from dpfair.tracking.runs import TrackingConfig, experiment_id, read_results
from dpfair.training import EXACT_TEST_METRICS, make_plan
from tests.conftest import epsilon_oracle
from tests.flows.conftest import SMALL_EXPERIMENT, fail_training_of, make_workspace

pytestmark = pytest.mark.slow


def _runs(client: MlflowClient, experiment_id: str) -> list:
    return client.search_runs([experiment_id], max_results=1000)


def _oracle(event: dp_event.DpEvent, delta: float) -> float:
    return epsilon_oracle(event, delta=delta)


def _artifact_event(client: MlflowClient, run_id: str, name: str, tmp: Path) -> dp_event.DpEvent:
    return accounting.event_from_json(Path(client.download_artifacts(run_id, name, str(tmp)))
                                      .read_text())


def _machine_readable(value: str) -> bool:
    """A tag value a program can read: one token or number (no spaces), one name of a fixed
    set (an accountant), or JSON."""
    if " " not in value or value in accounting.ACCOUNTANTS:
        return True
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def _released_names(runs: list) -> set[str]:
    return {k for r in runs for k in (*r.data.metrics, *r.data.params)}


def test_flow_logs_everything_to_mlflow(prefect_harness, tmp_path, repo_root, monkeypatch):
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    tuning = {"mode": "fixed", "n_runs": 2, "spaces": {"dpsgd": {"lr": [0.2, 0.5]}}}
    params_path = make_workspace(tmp_path, repo_root, SMALL_EXPERIMENT, tuning)
    out = run_experiment(str(params_path), str(tmp_path))
    params = load_params(params_path)
    client = MlflowClient(params.tracking.uri)
    runs = _runs(client, out["experiment_id"])
    by_id = {r.info.run_id: r for r in runs}
    parent = by_id[out["parent_run_id"]]
    assert parent.data.tags["dpfair.stage"] == "pipeline"
    assert parent.info.status == "FINISHED"
    assert out["tracking_url"].endswith(f"/#/experiments/{out['experiment_id']}/runs/"
                                        f"{out['parent_run_id']}")
    assert out["registered_model"] == {"name": "dpfair-synthetic", "version": "1",
                                       "champion": "1"}
    # one published data-version id (keyed: no md5 of the data, which would let anyone who
    # knows the other rows test whether a row is in it), the ledger's and nothing else
    from dpfair.ledger import SourceLedger
    from dpfair.ledger.people import version_id

    md5 = source_version("synthetic", params.dataset("synthetic"))
    arrays_md5 = data_version("synthetic", tmp_path / "dvc.lock")
    version = version_id(SourceLedger(".dpfair/ledger.sqlite", tmp_path).secret(), md5)
    assert parent.data.tags["dpfair.data_version"] == version == out["data_version"]
    published = " ".join([*(v for r in runs for v in r.data.tags.values()),
                          *(v for r in runs for v in r.data.params.values()),
                          *(d.dataset.digest for r in runs for d in r.inputs.dataset_inputs),
                          json.dumps(out, default=str)])
    assert md5 not in published and arrays_md5 not in published

    finals = [r for r in runs if r.data.tags.get("dpfair.stage") == "final"]
    pairs = sorted((r.data.tags["dpfair.method"], int(r.data.tags["dpfair.seed"])) for r in finals)
    assert pairs == sorted((m, s) for m in ["nonprivate", "dpsgd", "dpsgd_global"]
                           for s in (0, 1))
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in finals)
    assert all(r.data.tags["dpfair.data_version"] == version for r in finals)

    # tuning releases only the selected configuration: one run, no trial, no K, no score
    tune_runs = [r for r in runs if r.data.tags.get("dpfair.stage") == "tuning"]
    assert [r.data.tags["dpfair.method"] for r in tune_runs] == ["dpsgd"]
    tune_run = tune_runs[0]
    assert not [r for r in runs if r.data.tags.get("dpfair.stage") == "tuning-trial"]
    names = _released_names(runs)
    assert not {"K", "runs"} & names and not [n for n in names if n.startswith("score_")]
    assert tune_run.data.tags["dpfair.release"] == "selected"
    assert tune_run.data.params["selected.lr"] in ("0.2", "0.5")
    listed = {a.path for a in client.list_artifacts(tune_run.info.run_id)}
    assert listed == {"dp_event_search.json", "selected_config.json"}
    selected = json.loads(Path(client.download_artifacts(
        tune_run.info.run_id, "selected_config.json", str(tmp_path))).read_text())
    # the public base with the selected lr; no trial seed (it would tell the trial's number)
    assert selected["best_config"]["lr"] == float(tune_run.data.params["selected.lr"])
    assert "seed" not in selected["best_config"]
    # the search ran before its run opened: no published timestamp spans the trials (K)
    import optuna

    study = optuna.load_study(study_name=parent.data.tags["dpfair.study.dpsgd"],
                              storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    last_trial = max(t.datetime_complete for t in study.trials).timestamp() * 1000
    assert tune_run.info.start_time >= last_trial
    # ... the ledger is private working state beside the Optuna storage (the cwd's optuna.db)
    [ledger] = tmp_path.glob("*.ledger.PRIVATE.json")
    private = json.loads(ledger.read_text())
    assert private["status"] == PRIVATE_LEDGER_STATUS and private["K"] == 2
    assert "ledger" not in " ".join(a.path for r in runs
                                    for a in client.list_artifacts(r.info.run_id))

    # metrics consistent with the returned results; tags of privacy
    for summary in out["runs"]:
        run = by_id[summary["run_id"]]
        note = run.data.tags["mlflow.note.content"]  # the tags' meaning in words
        if summary["label"] == "nonprivate":  # no epsilon: its tag says why
            assert "epsilon" not in run.data.metrics
            assert run.data.tags["dpfair.epsilon"] == "none"
            assert f"- dpfair.epsilon: {NONPRIVATE_REFERENCE}" in note
            assert run.data.tags["dpfair.noise"] == "none"  # it has none to keep secret
            assert f"- dpfair.noise: {NO_NOISE}" in note
        else:
            assert run.data.metrics["epsilon"] == pytest.approx(summary["epsilon"])
            assert float(run.data.tags["dpfair.epsilon"]) > 0  # the planned ε of one run
            assert run.data.tags["dpfair.noise"] == "secret"
            assert f"- dpfair.noise: {SECRET_NOISE}" in note
        assert run.data.tags["dpfair.test_metrics"] == "exact"
        assert f"- dpfair.test_metrics: {EXACT_TEST_METRICS}" in note
        assert 0.0 <= run.data.metrics["final/test/accuracy"] <= 1.0
        groups = load_dataset("synthetic", params.dataset("synthetic")).group_names
        assert all(f"final/test/group_accuracy/{g}" in run.data.metrics for g in groups)
        history = client.get_metric_history(run.info.run_id, "test/accuracy")
        assert [m.step for m in history] == [1, 2, 3]
    dpsgd = [by_id[s["run_id"]] for s in out["runs"] if s["label"] == "dpsgd"]
    assert all(r.data.tags["tuning_privacy"] == "fixed" for r in dpsgd)
    assert all(r.data.metrics["epsilon_method_release"] > r.data.metrics["epsilon"]
               for r in dpsgd)
    assert all(r.data.tags["privacy_guarantee"] == "proven" for r in dpsgd)

    # the total is dp_accounting's composition of everything released: the search's event
    # and every final private run's event, read back from MLflow
    delta = parent.data.metrics["delta"]
    released = [_artifact_event(client, tune_run.info.run_id, "dp_event_search.json", tmp_path)]
    released += [_artifact_event(client, r.info.run_id, "dp_event.json", tmp_path)
                 for r in finals if r.data.tags["dpfair.method"] != "nonprivate"]
    total = _oracle(dp_event.ComposedDpEvent(released), delta)
    assert parent.data.metrics["epsilon_total"] == pytest.approx(total, rel=1e-4)
    assert out["release"]["epsilon_total"] == pytest.approx(total, rel=1e-4)
    assert float(parent.data.tags["dpfair.epsilon_total"]) == pytest.approx(total, rel=1e-4)
    assert "not covered: non-private reference" in parent.data.tags["mlflow.note.content"]
    # every ε of the results names its accountant, the search's run too
    assert out["release"]["accountant_total"] in accounting.ACCOUNTANTS
    tuned = out["release"]["methods"]["dpsgd"]
    assert {tuned["accountant_run"], tuned["accountant_search"], tuned["accountant"]} <= set(
        accounting.ACCOUNTANTS)
    assert tune_run.data.tags["dpfair.accountant_search"] == tuned["accountant_search"]
    assert TEST_METRICS_NOTE in parent.data.tags["mlflow.note.content"]
    # tags are machine-readable values (a token, a number, JSON); prose is in descriptions
    for r in runs:
        for key, value in r.data.tags.items():
            if not key.startswith("mlflow."):
                assert _machine_readable(value), (r.data.tags.get("mlflow.runName"), key, value)
    for r in dpsgd:
        assert r.data.metrics["epsilon_method_release"] == pytest.approx(
            parent.data.metrics["epsilon_released/dpsgd"])

    # artifacts: the DpEvent JSON of a private run, the table and figures of the parent
    event_path = client.download_artifacts(dpsgd[0].info.run_id, "dp_event.json", str(tmp_path))
    assert json.loads(Path(event_path).read_text())["type"] == "SelfComposedDpEvent"
    listed = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"group_accuracy.png", "privacy_cost.png", "report.html"} <= listed  # one click
    png = client.download_artifacts(parent.info.run_id, "group_accuracy.png", str(tmp_path))
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one comparison child run per method, the same keys on each: one chart per metric in
    # MLflow's chart view and Compare, a bar per method (issue 43)
    compared = {r.data.tags["dpfair.method"]: r.data.metrics for r in runs
                if r.data.tags.get("dpfair.stage") == "comparison"}
    assert set(compared) == {"nonprivate", "dpsgd", "dpsgd_global"}
    for label, metrics in compared.items():
        assert {"acc_majority", "acc_minority", "worst_group_accuracy"} <= set(metrics)
        assert metrics["acc_minority"] == pytest.approx(
            parent.data.metrics[f"group_accuracy/minority/{label}"])
    table = Path(client.download_artifacts(parent.info.run_id, "results/results.md",
                                           str(tmp_path))).read_text()
    assert "dpsgd_global" in table and TEST_METRICS_NOTE in table
    assert EPSILON_RUN in table and EPSILON_METHOD in table
    assert f"| {NONPRIVATE_REFERENCE} " in table
    assert out["table"] == table
    # `dpfair results` reads the latest pipeline run back
    assert read_results(params.tracking) == (parent.info.run_id, out["table"])


def test_all_trials_release_and_heuristic_methods(prefect_harness, tmp_path, repo_root,
                                                  monkeypatch):
    """tuning.release: all_trials logs every trial, K and the ledger, and reports the
    composition of the K runs; FairLens (allowed) shows no ε anywhere."""
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    experiment = {**SMALL_EXPERIMENT, "seeds": [0],
                  "methods": {"dpsgd": {"C": 1.0}, "fairlens": {"C": 1.0}}}
    tuning = {"release": "all_trials", "mode": "tnb", "eta": 1.0, "mu": 2.0,
              "spaces": {"dpsgd": {"lr": [0.2, 0.5]}}}
    params_path = make_workspace(tmp_path, repo_root, experiment, tuning,
                                 budget={"allow_heuristic": True,
                                         "allow_nonprivate_reference": True})
    out = run_experiment(str(params_path), str(tmp_path))
    client = MlflowClient(load_params(params_path).tracking.uri)
    runs = _runs(client, out["experiment_id"])
    [tune_run] = [r for r in runs if r.data.tags.get("dpfair.stage") == "tuning"]
    k = int(tune_run.data.metrics["K"])
    trials = [r for r in runs if r.data.tags.get("dpfair.stage") == "tuning-trial"]
    assert len(trials) == k
    assert all(r.data.tags["mlflow.parentRunId"] == tune_run.info.run_id for r in trials)
    assert all(f"score_{'macro_accuracy'}" in r.data.metrics for r in trials
               if r.data.tags["state"] == "COMPLETE")
    assert "ledger.json" in {a.path for a in client.list_artifacts(tune_run.info.run_id)}
    assert not list(tmp_path.glob("*.PRIVATE.json"))
    # ε of the search: the composition of K runs and their score releases
    params = load_params(params_path)
    cfg = params.tuning.config("dpsgd", "x")
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    base = params.experiment.train_config("dpsgd", 0)
    run_event = make_plan(base, len(dataset.train), dataset.n_groups).event
    k_runs = dp_event.SelfComposedDpEvent(
        dp_event.ComposedDpEvent([run_event, dp_event.GaussianDpEvent(cfg.sigma_score)]), k)
    delta = base.delta
    assert tune_run.data.metrics["epsilon_search"] == pytest.approx(_oracle(k_runs, delta),
                                                                    rel=1e-4)
    assert float(tune_run.data.tags["dpfair.epsilon_search"]) == pytest.approx(
        tune_run.data.metrics["epsilon_search"], rel=1e-5)
    assert f"all {k} trials released" in tune_run.data.tags["mlflow.note.content"]
    # FairLens: no ε metric, a tag saying why, the label in the table
    lens = [r for r in runs if r.data.tags.get("dpfair.method") == "fairlens"
            and r.data.tags.get("dpfair.stage") != "comparison"]  # its trainings
    assert lens and all(not [m for m in r.data.metrics if m.startswith("epsilon")]
                        for r in lens)
    assert all(r.data.tags["dpfair.epsilon"] == "heuristic" and f"dpfair.epsilon: {HEURISTIC}"
               in r.data.tags["mlflow.note.content"] for r in lens)
    row = next(line for line in out["table"].splitlines() if line.startswith("| fairlens "))
    assert row.count(HEURISTIC) == 2
    assert "epsilon_released/fairlens" not in client.get_run(out["parent_run_id"]).data.metrics
    assert out["release"]["methods"]["fairlens"]["guarantee"] == "heuristic"


def test_over_budget_run_is_refused_before_anything_trains(prefect_harness, tmp_path, repo_root,
                                                          monkeypatch):
    from dpfair.pipeline import method_steps
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)

    def no_training(*args, **kwargs):
        raise AssertionError("trained although the run is over budget")

    monkeypatch.setattr(method_steps, "train", no_training)
    monkeypatch.setattr(method_steps, "tune", no_training)
    params_path = make_workspace(tmp_path, repo_root, SMALL_EXPERIMENT,
                                 budget={"epsilon": 6.0, "allow_nonprivate_reference": True})
    with pytest.raises(PrivacyError) as err:
        run_experiment(str(params_path), str(tmp_path))
    msg = str(err.value)
    assert "nothing was trained" in msg and "exceeds budget.epsilon 6" in msg
    assert "dpsgd: not tuned; seeds 0, 1:" in msg and "dpsgd_global: not tuned" in msg
    assert "total, composition of every private release" in msg
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow run was opened


def test_budget_below_one_run_is_refused_as_such(prefect_harness, tmp_path, repo_root,
                                                 monkeypatch):
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    params_path = make_workspace(tmp_path, repo_root, SMALL_EXPERIMENT,
                                 budget={"epsilon": 1.0, "allow_nonprivate_reference": True})
    with pytest.raises(PrivacyError, match="too small for even one training run of 'dpsgd'.*"
                                           "Nothing was trained"):
        run_experiment(str(params_path), str(tmp_path))
    assert not (tmp_path / "mlflow.db").exists()


def test_results_without_runs_is_a_clear_error(tmp_path):
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(LookupError, match="no finished pipeline run"):
        read_results(cfg)


def test_failing_method_keeps_the_others(prefect_harness, tmp_path, repo_root, monkeypatch):
    """A user error inside the flow (a DpfairError from one method's training) ends the run as
    that error, not as MethodsFailed (a bug: below), so `dpfair run` prints it once with its
    fix and exit code; Prefect's records of it hold neither a traceback nor the message again
    (:func:`dpfair.cli.error_boundary.user_errors_once`, which `dpfair run` installs). The other
    methods' runs are logged."""
    import logging

    from dpfair.cli.error_boundary import user_errors_once
    from dpfair.errors import DataError
    from dpfair.pipeline import method_steps
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    refusal = "column 'x' holds 'q' (row 3), not a number. Fix: correct that value"
    fail_training_of(monkeypatch, "dpsgd_global", DataError(refusal))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    loggers = [logging.getLogger(n) for n in ("prefect.task_runs", "prefect.flow_runs")]
    failing_train = method_steps.train

    def train_watched(config, dataset, callbacks=()):  # Prefect's logging is configured now
        for logger in loggers:
            if handler not in logger.handlers:
                logger.addHandler(handler)
        return failing_train(config, dataset, callbacks)

    monkeypatch.setattr(method_steps, "train", train_watched)
    user_errors_once()
    params_path = make_workspace(tmp_path, repo_root, SMALL_EXPERIMENT)
    try:
        with pytest.raises(DataError, match=r"column 'x' holds 'q' \(row 3\)"):
            run_experiment(str(params_path), str(tmp_path))
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    failed = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert failed == ["Finished in state Failed (DataError: below)"] * 2, failed  # 2 seeds
    assert not any(r.exc_info or refusal in r.getMessage() for r in records)
    params = load_params(params_path)
    client = MlflowClient(params.tracking.uri)
    exp = client.get_experiment_by_name("dpfair-synthetic")
    runs = _runs(client, exp.experiment_id)
    parent = next(r for r in runs if r.data.tags.get("dpfair.stage") == "pipeline")
    assert parent.info.status == "FAILED"
    assert parent.data.tags["dpfair.failed_methods"] == "dpsgd_global"
    done = {(r.data.tags["dpfair.method"], r.info.status) for r in runs
            if r.data.tags.get("dpfair.stage") == "final"}
    assert ("dpsgd", "FINISHED") in done and ("nonprivate", "FINISHED") in done
    assert ("dpsgd_global", "FAILED") in done
    listed = {a.path for a in client.list_artifacts(parent.info.run_id, "results")}
    assert "results/results.md" in listed


def test_invalid_params_fail_before_any_work(tmp_path, repo_root, monkeypatch):
    from flows.experiment import run_experiment

    monkeypatch.chdir(tmp_path)
    bad = copy.deepcopy(SMALL_EXPERIMENT)
    bad["train"]["lr"] = -1
    params_path = make_workspace(tmp_path, repo_root, bad)
    with pytest.raises(ConfigError) as err:
        run_experiment(str(params_path), str(tmp_path))
    assert "experiment.train.lr" in str(err.value)
    assert not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "data" / "prepared").exists()  # nothing was prepared
    # a typo in a section name: one message with a suggestion
    data = yaml.safe_load(params_path.read_text())
    data["experimnt"] = data.pop("experiment")
    params_path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="did you mean 'experiment'"):
        run_experiment(str(params_path), str(tmp_path))


def test_all_methods_failing_is_reported_and_stale_runs_are_failed(prefect_harness, tmp_path,
                                                                   repo_root, monkeypatch):
    """No training finishes: the methods' errors are raised, with the summary's own error
    after them (not instead); a run a killed process left RUNNING is marked FAILED first."""
    from dpfair.pipeline import method_steps
    from flows.experiment import MethodsFailed, run_experiment
    from tests.tracking.conftest import killed_run

    monkeypatch.chdir(tmp_path)

    def always_fail(config, dataset, callbacks=()):
        raise RuntimeError(f"boom in {config.method.name}")

    monkeypatch.setattr(method_steps, "train", always_fail)
    params_path = make_workspace(tmp_path, repo_root, SMALL_EXPERIMENT)
    params = load_params(params_path)
    stale = killed_run(params.tracking, experiment_id(params.tracking, "synthetic"))
    with pytest.raises(MethodsFailed) as err:
        run_experiment(str(params_path), str(tmp_path))
    msg = str(err.value)
    for name in ("dpsgd", "dpsgd_global", "nonprivate"):
        assert f"{name}: RuntimeError: boom in {name}" in msg
    assert msg.endswith("the summary failed too: ValueError: no training finished: there is "
                        "nothing to summarise")
    assert "lack columns" not in msg
    client = MlflowClient(params.tracking.uri)
    assert client.get_run(stale).info.status == "FAILED"
    assert "dpfair.stale" in client.get_run(stale).data.tags
    exp = client.get_experiment_by_name("dpfair-synthetic")
    [parent] = [r for r in _runs(client, exp.experiment_id)
                if r.data.tags.get("dpfair.stage") == "pipeline" and r.info.run_id != stale]
    assert parent.info.status == "FAILED"
    assert parent.data.tags["dpfair.failed_methods"] == "dpsgd,dpsgd_global,nonprivate"
    with pytest.raises(LookupError, match="no finished pipeline run"):
        read_results(params.tracking)
