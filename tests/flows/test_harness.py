"""The flow tests' Prefect harness (``tests.conftest.prefect_harness``) serves from a copy of
Prefect's empty database, as a new home's temporary server does: had Prefect's harness stopped
making its folder as the seeding expects, its server would migrate a database of its own."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from flows.server import empty_database


def test_the_harness_serves_a_copy_of_the_empty_database(prefect_harness):
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url.get_secret_value()
    served = Path(url.removeprefix("sqlite+aiosqlite:///"))
    assert served.name == "prefect-test.db" and served.is_file(), url
    same = "select id from block_type order by id"  # random ids: copied, not made
    with closing(sqlite3.connect(served)) as db, closing(sqlite3.connect(empty_database())) as t:
        assert db.execute(same).fetchall() == t.execute(same).fetchall()
