"""MLflow's empty SQLite store, made once per MLflow version and copied into every new one.

The first open of a new SQLite tracking store runs MLflow's schema migrations, one after the
other: 1.5-3 s of CPU for every new project, test workspace or DVC experiment. The schema is
the same for every store of one MLflow version, so dpfair makes it once, in the user's cache
(:func:`dpfair.user_cache.made_once`, ``mlflow-schema/``; ``make install`` makes it), and a new
store starts as a copy of it (SQLite's online backup), under the lock that serialises a new
store's creation (:func:`dpfair.workspace.open_racing`). MLflow then opens the copy as any
store: it checks that the schema is at its head revision and creates the ``Default``
experiment with the store's own artifact root (the empty store holds no experiment).

Where the cache cannot be written, nothing is copied and MLflow creates the schema itself.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import mlflow
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

from dpfair.user_cache import copy_sqlite, made_once

__all__ = ["empty_store", "seed"]


def empty_store() -> Path:
    """The empty store of the installed MLflow version, made on first use."""
    return made_once(f"mlflow-schema/mlflow-{mlflow.__version__}.sqlite", _make)


def seed(database: str) -> None:
    """Copy the empty store into the new (empty) SQLite file ``database``; the caller holds
    its creation lock. An unwritable cache leaves the file as it is (MLflow then migrates)."""
    try:
        template = empty_store()
    except OSError:
        return
    copy_sqlite(template, database)


def _make(database: Path) -> None:
    """MLflow's schema in the new file ``database``, without the ``Default`` experiment."""
    store = SqlAlchemyStore(f"sqlite:///{database}", database.parent.as_uri())
    store.engine.dispose()
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("DELETE FROM experiments WHERE experiment_id = ?",
                   (int(SqlAlchemyStore.DEFAULT_EXPERIMENT_ID),))
        db.commit()
        db.execute("VACUUM")
