"""Several `dpfair tune` started together against a fresh PostgreSQL database (the README's
multi-machine recipe): each opens the Optuna storage, and the first use creates its schema.
Their schema creations race (``UniqueViolation ... alembic_version``, a table that already
exists); dpfair retries the race, so every process opens the storage."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg2

OPEN = """
import sys, time
from dpfair.tuning.config import TuningConfig
from dpfair.tuning.study import make_storage
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # all at once
make_storage(TuningConfig(storage=sys.argv[1], study_name="s"))
print("opened")
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


def test_processes_opening_a_fresh_database_together_all_open_it(postgres_url,
                                                                 tmp_path: Path) -> None:
    for _ in range(2):  # the race is timing-dependent: two fresh databases
        url = _fresh_database(postgres_url)
        start = time.time() + 6.0  # after every interpreter has imported optuna
        procs = [subprocess.Popen([sys.executable, "-c", OPEN, url, str(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0 and "opened" in out, err[-3000:]
