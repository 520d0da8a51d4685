"""The search on a cluster (README: "Private tuning, several workers, PostgreSQL"): one study's
`dpfair tune` started at once on the 2 workers of a local Dask cluster (as on two machines),
sharing a real PostgreSQL server for the Optuna study and the privacy ledger. The search is
charged once (the later process joins it uncharged) and K runs are trained in all."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

pytest.importorskip("distributed", reason="dask.distributed is not installed (pyproject.toml)")

pytestmark = pytest.mark.slow

#: what each Dask worker runs (a machine's `dpfair tune`), once both are ready
TUNE = """
import os, sys, time
from typer.testing import CliRunner
from dpfair.cli import app
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))  # both at once
out = CliRunner().invoke(app, ["tune", "--method", "dpsgd", "--study", "loans",
                               "--storage", sys.argv[2]])
print("pid", os.getpid())
print(out.output)
sys.exit(out.exit_code)
"""
N_RUNS = 4


def _database(server: str, name: str) -> str:
    """A new database ``name`` on the server of ``server`` (a URL), as the README's form."""
    import psycopg

    url = server.replace("postgresql+psycopg2://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


def test_one_search_on_two_dask_workers_sharing_postgresql_is_charged_once(
        tmp_path: Path, postgres_url: str) -> None:
    from distributed import Client, LocalCluster

    from dpfair.ledger import SourceLedger

    study_db, ledger_db = _database(postgres_url, "optuna"), _database(postgres_url, "ledger")
    params = {
        "budget": {"ledger": ledger_db},
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {
            "dataset": "synthetic", "model": {"name": "logistic_regression"},
            "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
                      "progress": False},
            "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0],
        },
        "tuning": {"mode": "fixed", "n_runs": N_RUNS, "spaces": {"dpsgd": {"lr": [0.1, 0.5]}}},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                     "artifact_root": str(tmp_path / "art")},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2
        start = time.time() + 10.0  # after both interpreters have imported dpfair's CLI
        jobs = [client.submit(subprocess.run, [sys.executable, "-c", TUNE, str(start), study_db],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              workers=[worker], pure=False, key=f"tune-{i}")
                for i, worker in enumerate(workers)]
        done = client.gather(jobs)
    for proc in done:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    searches = [r for r in SourceLedger(ledger_db).releases() if r.counts and "study" in r.context]
    assert len(searches) == 1, [r.context for r in searches]  # charged once, on the server
    trials = optuna.load_study(study_name="loans", storage=study_db).get_trials(deepcopy=False)
    runs = [t for t in trials if t.user_attrs.get("dpfair.ledger") == "run"]
    assert len(runs) == N_RUNS and all(t.state.name == "COMPLETE" for t in runs)
    pids = {int(line.split()[1]) for proc in done for line in proc.stdout.splitlines()
            if line.startswith("pid ")}
    assert {t.user_attrs["dpfair.pid"] for t in runs} <= pids  # trained by the two workers' jobs
