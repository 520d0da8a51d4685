"""Workers: the excess-trial race, killed workers, several worker processes on the journal
and PostgreSQL storages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from types import SimpleNamespace

import optuna
import pytest

import dpfair.tuning.worker as worker_module
from dpfair import tuning
from dpfair.tuning.study import CONFIG_SEED, TrialSeededRandomSampler, distributions
from dpfair.tuning.trial_records import is_run
from tests.tuning.conftest import (
    BASE,
    METHOD,
    SPACE,
    TRAIN,
    cfg,
    check_exactly_k,
    fast_event,
    fast_tune,
    make_dataset,
    prepare_untrained,
    seed_with_k,
    worker_env,
)


def test_excess_trial_is_not_a_run(tmp_path, monkeypatch):
    """Race: a worker counted K-1 runs, but another worker claimed the last slot before its
    ask. Its trial (number K) is marked excess and PRUNED without training."""
    ds = make_dataset()
    c = cfg(tmp_path, mode="fixed", n_runs=1, study_name="x")
    job = prepare_untrained(c, ds)
    study = optuna.load_study(study_name="x", storage=c["storage"])
    other = study.ask()  # another worker's run, number 0
    study.tell(other, 0.5)
    real_is_run = is_run
    calls = {"n": 0}

    def stale_count(t, k):  # the first count misses the other worker's claim
        calls["n"] += 1
        return False if calls["n"] == 1 else real_is_run(t, k)

    monkeypatch.setattr(worker_module, "is_run", stale_count)
    tuning.run_worker(job, 1)
    monkeypatch.setattr(worker_module, "is_run", real_is_run)
    res = tuning.finish(job)
    assert res.n_runs == 1 and [r["ledger"] for r in res.trials] == ["run", "excess"]
    assert res.trials[1]["state"] == "PRUNED" and res.trials[1]["config"] is None


# ------------------------------------------------------------------ worker processes


@pytest.mark.parametrize("backend", ["sqlite", "journal"])
def test_killed_worker_counts_and_resume(tmp_path, backend):
    """SQLite: Optuna's RDB heartbeat; journal: dpfair's heartbeat attr (no Optuna heartbeat)."""
    ds = make_dataset()
    seed = seed_with_k(3, 5, mu=3.0)
    base = {**BASE, "sleep": 60}
    c = cfg(tmp_path, mu=3.0, seed=seed, heartbeat_interval=1, grace_period=2, reproducible=True)
    if backend == "journal":
        c["storage"] = f"journal:{tmp_path / 'journal.log'}"
    job = tuning.prepare(METHOD, base, ds, c, TRAIN, event_fn=fast_event)
    k = job.k
    spec = tuning.write_spec(job, tmp_path / "job.pkl")
    marker = tmp_path / "started"
    env = {**worker_env(), "DPFAIR_TEST_SLOW": "1", "DPFAIR_TEST_MARKER": str(marker)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpfair.tuning", "worker", str(spec), "0"], env=env
    )
    try:
        deadline = time.time() + 90
        while not marker.exists():
            assert proc.poll() is None and time.time() < deadline, "worker did not start"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # mid-trial
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # resume in this process (not slow): the killed trial fails as stale and counts
    res = tuning.tune(METHOD, base, ds, c, TRAIN, event_fn=fast_event)
    assert res.K == k
    check_exactly_k(res)
    killed = [r for r in res.trials if r["number"] == 0][0]
    assert killed["state"] == "FAIL" and killed["failed_by"] == "stale"
    assert killed["ledger"] == "run" and killed["worker"] == 0
    assert sum(r["state"] == "COMPLETE" for r in res.trials) == k - 1


def test_two_workers_journal(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", worker_env()["PYTHONPATH"])
    ds = make_dataset()
    c = cfg(
        tmp_path,
        mode="fixed",
        n_runs=8,
        workers=2,
        study_name="j",
        storage=f"journal:{tmp_path / 'journal.log'}",
        heartbeat_interval=5,  # grace 10 s: no live worker is failed under load
    )  # not reproducible: the configuration draws are seeded by the study's secret
    res = fast_tune(c, ds)
    check_exactly_k(res)
    assert res.K == 8 and all(r["state"] == "COMPLETE" for r in res.trials if r["ledger"] == "run")
    # configurations depend on the trial number and the study's seed only, whichever worker
    # ran them (i.i.d., and the same for every worker, resume and machine)
    study = optuna.load_study(study_name="j", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log"))))
    sampler = TrialSeededRandomSampler(study.user_attrs[CONFIG_SEED], 0)
    dists = distributions(SPACE)
    for r in res.trials:
        t = SimpleNamespace(number=r["number"])
        assert r["params"] == {
            k: sampler.sample_independent(None, t, k, d) for k, d in dists.items()
        }


def _readme_form(url: str) -> str:
    """``postgresql://...`` as the README writes it (SQLAlchemy 2 picks psycopg 3 for it)."""
    return url.replace("postgresql+psycopg2://", "postgresql://")


def test_two_workers_postgres(tmp_path, monkeypatch, postgres_url):
    postgres_url = _readme_form(postgres_url)
    monkeypatch.setenv("PYTHONPATH", worker_env()["PYTHONPATH"])
    ds = make_dataset()
    seed = seed_with_k(5, 9, mu=6.0, eta=1.0)
    c = cfg(
        tmp_path,
        mu=6.0,
        eta=1.0,
        seed=seed,
        workers=2,
        study_name="pg",
        storage=postgres_url,
        heartbeat_interval=5,
        reproducible=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fast_tune(c, ds)
    check_exactly_k(res)
    assert res.K == tuning.draw_k(
        tuning.TuningConfig(mu=6.0, eta=1.0, seed=seed, reproducible=True), 1
    )
    assert {r["worker"] for r in res.trials if r["ledger"] == "run"} <= {0, 1}
    assert optuna.load_study(study_name="pg", storage=postgres_url).user_attrs["dpfair.K"] == res.K


def test_readme_postgresql_url_serves_an_mlflow_store(postgres_url):
    """The README's `postgresql://user@host/db` (SQLAlchemy 2's psycopg driver) also backs
    MLflow's tracking store, as `mlflow server --backend-store-uri` uses it."""
    import psycopg
    from mlflow import MlflowClient

    postgres_url = _readme_form(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # its own database
        conn.execute("CREATE DATABASE mlflow_store")
    client = MlflowClient(postgres_url.rsplit("/", 1)[0] + "/mlflow_store")
    exp = client.create_experiment("pg-store")
    assert client.get_experiment(exp).name == "pg-store"


def test_a_run_stopped_by_sigterm_is_failed_and_no_other_starts(tmp_path, monkeypatch):
    """SIGTERM mid-run in `dpfair tune`'s own process (sigterm_raises turns it into
    Terminated): the run in flight is told FAIL (it counts, with the reason), never left
    RUNNING, and no other trial is claimed."""
    import threading

    from optuna.trial import TrialState

    from dpfair import processes
    from dpfair.errors import Terminated
    from dpfair.processes import sigterm_raises

    monkeypatch.setattr(processes, "_STOP", threading.Event())  # the flag is this test's
    marker = tmp_path / "started"
    monkeypatch.setenv("DPFAIR_TEST_SLOW", "1")
    monkeypatch.setenv("DPFAIR_TEST_MARKER", str(marker))
    c = cfg(tmp_path, mode="fixed", n_runs=3, study_name="stop")
    job = tuning.prepare(METHOD, {**BASE, "sleep": 60}, make_dataset(), c, TRAIN,
                         event_fn=fast_event)

    def stop_when_started() -> None:
        deadline = time.time() + 60
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_started, daemon=True).start()
    with pytest.raises(Terminated), sigterm_raises():
        tuning.run_worker(job)
    trials = optuna.load_study(study_name="stop", storage=c["storage"]).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL]
    assert trials[0].user_attrs["dpfair.error"].startswith("stopped (Terminated)")


def test_sigterm_while_waiting_for_the_journal_lock_leaves_the_holders_lock(tmp_path, monkeypatch):
    """A SIGTERM while a trial's write waits for Optuna's journal-file lock, held by another
    worker: the write waits on and is done, then Terminated is raised. Cut inside the wait,
    Optuna's lock removed the other worker's lock (or raised RuntimeError when it was let go
    meanwhile: a trial then failed with that error instead of "stopped (Terminated)")."""
    import threading

    from optuna.storages.journal import JournalFileBackend

    from dpfair import processes
    from dpfair.errors import Terminated
    from dpfair.processes import sigterm_raises

    monkeypatch.setattr(processes, "_STOP", threading.Event())  # the flag is this test's
    path = str(tmp_path / "optuna.journal")
    study = optuna.create_study(storage=optuna.storages.JournalStorage(JournalFileBackend(path)))
    trial = study.ask()
    lock = path + ".lock"  # Optuna's symlink lock of the journal file
    held_to_the_end = []

    def other_worker_lets_go() -> None:
        time.sleep(1.5)
        held_to_the_end.append(os.path.lexists(lock))
        os.unlink(lock)

    os.symlink(path, lock)  # another worker holds the lock
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    threading.Thread(target=other_worker_lets_go, daemon=True).start()
    with pytest.raises(Terminated), sigterm_raises():
        worker_module._record(trial, {"dpfair.seed": 7})
    assert held_to_the_end == [True]
    assert study.trials[0].user_attrs["dpfair.seed"] == 7
