"""A reservation made once per key (a search's identity): processes that reserve the same key
at the same moment record one release; the others join it uncharged. They really race: each
opens the ledger, says it is ready and waits (asleep, reading its stdin) for the go, a key
written to every one at once when all are ready, and only then reserves; the same processes
race again on a second key. On SQLite (a file) and PostgreSQL (a throwaway server)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from dp_accounting import dp_event

from dpfair.ledger import SourceLedger
from tests.conftest import race

RACERS = 4

RESERVE = """
import sys
from dp_accounting import dp_event
from dpfair.ledger import SourceLedger
url, me = sys.argv[1:3]
ledger = SourceLedger(url)  # connected and its tables made before the first go
print("ready", flush=True)
for line in iter(sys.stdin.readline, ""):  # each go is a key, written to every racer at once
    key = line.strip()
    got = ledger.reserve_once(key, "census", "v1", dp_event.GaussianDpEvent(1.0), 1e-5,
                              context={"study": key, "racer": me})
    print("reserved" if got is not None else "joined", flush=True)
"""


def _fresh_database(server_url: str) -> str:
    """A new, empty database on the test server; its URL."""
    name = f"ledger_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def _races(url: str) -> None:
    """Two keys, two races of the same :data:`RACERS` processes, each charged once."""
    keys = [f"search {uuid.uuid4().hex}" for _ in range(2)]
    for key, said in zip(keys, race(RESERVE, [[url, str(i)] for i in range(RACERS)], keys),
                         strict=True):
        _assert_charged_once(url, key, said)


def _assert_charged_once(url: str, key: str, said: list[str]) -> None:
    assert sorted(said) == ["joined"] * (RACERS - 1) + ["reserved"], said
    charged = [r for r in SourceLedger(url).releases() if r.context.get("study") == key]
    assert len(charged) == 1, [r.context for r in charged]


def test_processes_reserving_one_key_together_record_one_release_on_sqlite(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    SourceLedger(url)  # an existing ledger (a fresh one is raced in the PostgreSQL test)
    _races(url)


def test_processes_reserving_one_key_together_record_one_release_on_postgresql(
        postgres_url):
    url = _fresh_database(postgres_url)  # its tables made by the racers themselves
    _races(url)


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
