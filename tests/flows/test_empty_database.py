"""A temporary Prefect server on a new home starts from a copy of Prefect's empty database (made
once per Prefect version in the user's cache, by `make install`): it skips the migrations, holds
no run and no telemetry session, and serves a flow as a server that migrated its own."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest
from pydantic import SecretStr

from flows import server

_RUN_A_FLOW = """
import sys
from prefect import flow
from flows.server import api_server_ready, start_api_server

@flow
def hello(x: int) -> int:
    return x + 1

start_api_server()
api_server_ready()
assert hello(1) == 2
"""


def _rows(path) -> dict[str, int]:
    with closing(sqlite3.connect(path)) as db:
        tables = [t for (t,) in db.execute("select name from sqlite_master where type='table'")]
        return {t: db.execute(f"select count(*) from '{t}'").fetchone()[0] for t in tables}


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    """Prefect's empty database, made once for this module in a cache of its own."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["DPFAIR_CACHE"], before = str(cache), os.environ.get("DPFAIR_CACHE")
    try:
        yield cache, server.empty_database()
    finally:
        if before is None:
            del os.environ["DPFAIR_CACHE"]
        else:
            os.environ["DPFAIR_CACHE"] = before


def test_the_empty_database_holds_the_schema_and_blocks_and_no_run(empty):
    rows = _rows(empty[1])
    assert rows["alembic_version"] == 1 and rows["block_type"] > 0
    assert rows["flow_run"] == rows["flow"] == rows["log"] == 0
    assert rows["configuration"] == 0, "no telemetry session, no setting of the maker's"
    assert not [p for p in empty[1].parent.iterdir() if p.name.startswith(".making-")]


def test_a_new_home_starts_from_it_and_runs_a_flow(empty, tmp_path):
    cache, made = empty
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(DPFAIR_CACHE=str(cache), PREFECT_HOME=str(home), PREFECT_LOGGING_LEVEL="ERROR")
    done = subprocess.run([sys.executable, "-c", _RUN_A_FLOW], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _rows(home / "prefect.db")["flow_run"] == 1
    with closing(sqlite3.connect(home / "prefect.db")) as db, \
            closing(sqlite3.connect(made)) as template:
        for same in ("select version_num from alembic_version",
                     "select id from block_type order by id"):  # random ids: copied, not made
            assert db.execute(same).fetchall() == template.execute(same).fetchall()


def test_an_existing_database_is_never_replaced(empty, tmp_path):
    database = tmp_path / "prefect.db"
    with closing(sqlite3.connect(database)) as db:
        db.execute("create table mine (x)")
        db.commit()
    server._seed_database(SecretStr(f"sqlite+aiosqlite:///{database}"))
    assert _rows(database) == {"mine": 0}


def test_no_empty_database_or_another_database_leaves_the_server_to_migrate(tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("DPFAIR_CACHE", str(tmp_path / "no-cache"))
    server._seed_database(SecretStr(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"))
    server._seed_database(SecretStr("postgresql+asyncpg://u@h/db"))
    assert not (tmp_path / "a.db").exists()
