"""Several `dpfair tune` started together against a fresh PostgreSQL database (the README's
multi-machine recipe): each opens the Optuna storage, and the first use creates its schema.
Their schema creations race (``UniqueViolation ... alembic_version``, a table that already
exists); dpfair retries the race, so every process opens the storage."""

from __future__ import annotations

import uuid

import psycopg2

from tests.conftest import race

OPEN = """
import sys
import optuna
from dpfair.tuning.config import TuningConfig
from dpfair.tuning.study import make_storage
print("ready", flush=True)  # optuna imported
for url in iter(sys.stdin.readline, ""):  # each go a fresh database, written to all at once
    make_storage(TuningConfig(storage=url.strip(), study_name="s"))
    print("opened", flush=True)
"""


def _fresh_database(server_url: str) -> str:
    """A new, empty database on the test server; its URL."""
    name = f"fresh_{uuid.uuid4().hex[:12]}"
    conn = psycopg2.connect(server_url.replace("postgresql+psycopg2://", "postgresql://"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    conn.close()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def test_processes_opening_a_fresh_database_together_all_open_it(postgres_url) -> None:
    # the race is timing-dependent: the same 4 processes race on two fresh databases
    urls = [_fresh_database(postgres_url) for _ in range(2)]
    assert race(OPEN, [[]] * 4, urls) == [["opened"] * 4] * 2
