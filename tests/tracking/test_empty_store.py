"""A new SQLite tracking store starts as a copy of MLflow's empty store (made once per MLflow
version in the user's cache) and is then the same as a store MLflow migrated itself."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

import pytest
from mlflow import MlflowClient

from dpfair.settings import TrackingConfig
from dpfair.tracking import empty_store, runs
from dpfair.workspace import open_racing


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFAIR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _schema(path) -> list[tuple]:
    """Every table's and index's definition, its clauses as a sorted list (MLflow's own
    migrations order a table's constraints differently from one store to the next)."""
    with closing(sqlite3.connect(path)) as db:
        found = db.execute("select type, name, tbl_name, sql from sqlite_master")
        return sorted((kind, name, table, sorted(line.strip().rstrip(",")
                                                 for line in (sql or "").splitlines()))
                      for kind, name, table, sql in found)


def _revision(path) -> list[tuple]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("select version_num from alembic_version").fetchall()


def _use(uri: str) -> list[tuple]:
    """The same work on a store: an experiment, a run with a metric, a registered model."""
    mlf = MlflowClient(tracking_uri=uri)
    made = mlf.create_experiment("exp")
    run = mlf.create_run(made)
    mlf.log_metric(run.info.run_id, "m", 1.5)
    mlf.create_registered_model("model")
    return [(e.experiment_id, e.name) for e in mlf.search_experiments()] + [
        (made, run.info.experiment_id, mlf.get_run(run.info.run_id).data.metrics["m"]),
        tuple(m.name for m in mlf.search_registered_models()),
    ]


def test_a_seeded_store_is_the_store_mlflow_makes(tmp_path, cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seeded, plain = tmp_path / "seeded.db", tmp_path / "plain.db"
    runs.client(TrackingConfig(uri=f"sqlite:///{seeded}"))
    assert (cache / "mlflow-schema").is_dir(), "the empty store was made in the cache"
    MlflowClient(tracking_uri=f"sqlite:///{plain}").search_experiments()  # MLflow migrates

    assert _schema(seeded) == _schema(plain)
    assert _revision(seeded) == _revision(plain)
    default = [MlflowClient(tracking_uri=f"sqlite:///{p}").get_experiment("0")
               for p in (seeded, plain)]
    assert [e.artifact_location for e in default] == [default[1].artifact_location] * 2
    assert _use(f"sqlite:///{seeded}") == _use(f"sqlite:///{plain}")


def test_the_empty_store_holds_no_experiment(cache):
    with closing(sqlite3.connect(empty_store.empty_store())) as db:
        assert db.execute("select count(*) from experiments").fetchone() == (0,)
        assert db.execute("select count(*) from runs").fetchone() == (0,)


def test_a_store_with_runs_is_never_seeded_again(tmp_path, cache):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first = _use(uri)
    open_racing(lambda: MlflowClient(tracking_uri=uri).search_experiments(), uri,
                seed=empty_store.seed)
    assert [(e.experiment_id, e.name) for e in MlflowClient(tracking_uri=uri)
            .search_experiments()] == first[:2]


def test_an_unwritable_cache_leaves_the_migration_to_mlflow(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DPFAIR_CACHE", str(blocker / "cache"))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    found = open_racing(lambda: MlflowClient(tracking_uri=uri).search_experiments(), uri,
                        seed=empty_store.seed)
    assert [e.name for e in found] == ["Default"]


def test_threads_making_the_empty_store_together_each_find_a_whole_one(cache):
    made, errors = [], []

    def make() -> None:
        try:
            made.append(empty_store.empty_store())
        except Exception as exc:  # pragma: no cover - the failure the test looks for
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(made)) == 1
    assert _revision(made[0])
    assert not [p for p in made[0].parent.iterdir() if p.name.startswith(".making-")]
