"""A reservation made once per key (a search's identity): processes that reserve the same key
at the same moment record one release; the others join it uncharged. They really race: each
opens the ledger, then waits at a file barrier until every one is ready, and only then
reserves. On SQLite (a file) and PostgreSQL (a throwaway server)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import sqlalchemy as sa
from dp_accounting import dp_event

from dpfair.ledger import SourceLedger

RACERS = 4

RESERVE = """
import sys, time
from pathlib import Path
from dp_accounting import dp_event
from dpfair.ledger import SourceLedger
url, key, barrier, me, n = *sys.argv[1:3], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
ledger = SourceLedger(url)  # connected and its tables made before the barrier
(barrier / f"ready-{me}").touch()
while len(list(barrier.glob("ready-*"))) < n:
    time.sleep(0.001)
got = ledger.reserve_once(key, "census", "v1", dp_event.GaussianDpEvent(1.0), 1e-5,
                          context={"study": key, "racer": me})
print("reserved" if got is not None else "joined", flush=True)
"""


def _race(url: str, key: str, tmp_path: Path) -> list[str]:
    barrier = tmp_path / f"barrier-{uuid.uuid4().hex[:8]}"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", RESERVE, url, key, str(barrier), str(i),
                               str(RACERS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(RACERS)]
    said = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        said.append(out.strip())
    return said


def _fresh_database(server_url: str) -> str:
    """A new, empty database on the test server; its URL."""
    name = f"ledger_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def _assert_charged_once(url: str, key: str, said: list[str]) -> None:
    assert sorted(said) == ["joined"] * (RACERS - 1) + ["reserved"], said
    charged = [r for r in SourceLedger(url).releases() if r.context.get("study") == key]
    assert len(charged) == 1, [r.context for r in charged]


def test_processes_reserving_one_key_together_record_one_release_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    SourceLedger(url)  # an existing ledger (a fresh one is raced in the PostgreSQL test)
    for _ in range(2):  # two keys: two races
        key = f"search {uuid.uuid4().hex}"
        _assert_charged_once(url, key, _race(url, key, tmp_path))


def test_processes_reserving_one_key_together_record_one_release_on_postgresql(
        postgres_url, tmp_path):
    url = _fresh_database(postgres_url)  # its tables made by the racers themselves
    for _ in range(2):
        key = f"search {uuid.uuid4().hex}"
        _assert_charged_once(url, key, _race(url, key, tmp_path))


def test_a_void_reservation_frees_its_key_and_a_counted_one_holds_it(tmp_path):
    """A search that stopped before anything left the process (void) is charged when it runs
    again; one that counts (pending, failed, released) is never charged twice."""
    ledger = SourceLedger(tmp_path / "ledger.sqlite")
    event = dp_event.GaussianDpEvent(1.0)
    first = ledger.reserve_once("search s", "census", "v1", event, 1e-5)
    assert first is not None
    ledger.settle(first.id, "void")
    second = ledger.reserve_once("search s", "census", "v1", event, 1e-5)
    assert second is not None and second.id != first.id
    for status in ("pending", "failed", "released"):
        if status != "pending":
            ledger.settle(second.id, status)
        assert ledger.reserve_once("search s", "census", "v1", event, 1e-5) is None
    assert ledger.reserve_once("search t", "census", "v1", event, 1e-5) is not None
    assert [r.status for r in ledger.releases()] == ["void", "released", "pending"]
