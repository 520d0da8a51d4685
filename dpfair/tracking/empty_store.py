"""MLflow's empty SQLite store, made once per MLflow version and copied into every new one.

The first open of a new SQLite tracking store runs MLflow's schema migrations, one after the
other: 1.5-3 s of CPU for every new project, test workspace or DVC experiment. The schema is
the same for every store of one MLflow version, so dpfair makes it once, in the user's cache
(:func:`dpfair.user_cache.cache_dir`, ``mlflow-schema/``), and a new store starts as a copy of
it (SQLite's online backup, which takes SQLite's own locks), under the lock that serialises a
new store's creation (:func:`dpfair.workspace.open_racing`). MLflow then opens the copy as any
store: it checks that the schema is at its head revision and creates the ``Default``
experiment with the store's own artifact root (the empty store holds no experiment).

Where the cache cannot be written, nothing is copied and MLflow creates the schema itself.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path

import mlflow
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from dpfair.user_cache import cache_dir
from dpfair.workspace import exclusive

__all__ = ["empty_store", "seed"]


def empty_store() -> Path:
    """The empty store of the installed MLflow version, made on first use."""
    path = cache_dir() / "mlflow-schema" / f"mlflow-{mlflow.__version__}.sqlite"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive(path.with_name(path.name + ".lock")):  # one maker; the others wait
            if not path.is_file():
                _make(path)
    return path


def seed(database: str) -> None:
    """Copy the empty store into the new (empty) SQLite file ``database``; the caller holds
    its creation lock. An unwritable cache leaves the file as it is (MLflow then migrates)."""
    try:
        template = empty_store()
    except OSError:
        return
    with contextlib.closing(sqlite3.connect(template)) as source, \
            contextlib.closing(sqlite3.connect(database)) as target:
        source.backup(target)


def _make(path: Path) -> None:
    """Build the empty store beside ``path`` and move it into place in one rename (a process
    killed half-way leaves no store, only a scratch folder that the next maker ignores)."""
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".making-") as scratch:
        database = Path(scratch) / "store.sqlite"
        store = SqlAlchemyStore(f"sqlite:///{database}", Path(scratch).as_uri())
        store.engine.dispose()
        with contextlib.closing(sqlite3.connect(database)) as db:
            db.execute("DELETE FROM experiments WHERE experiment_id = ?",
                       (int(SqlAlchemyStore.DEFAULT_EXPERIMENT_ID),))
            db.commit()
            db.execute("VACUUM")
        os.replace(database, path)
