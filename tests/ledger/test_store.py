"""The ledger's durable store (dpfair/ledger/store.py): a JSON ledger of earlier versions is
imported, a database server shared by machines (a real PostgreSQL), passwords never shown,
paths resolved against the project root from DVC's temporary workspaces."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dp_accounting import dp_event

from dpfair import accounting
from dpfair.ledger import SourceLedger
from dpfair.ledger.store import ledger_url
from dpfair.urls import mask_url as mask_password
from dpfair.workspace import durable_sqlite_uri, open_racing, project_root

DELTA = 1e-5
EVENT = accounting.run_event(dp_event.GaussianDpEvent(1.0), 0.02, 200)


def test_an_earlier_json_ledger_is_imported_once(tmp_path):
    legacy = tmp_path / ".dpfair" / "privacy_ledger.json"
    legacy.parent.mkdir()
    event = json.loads(accounting.event_to_json(EVENT))
    rows = [{"id": f"r{i}", "source": "loans", "version": f"v{i}", "account": account,
             "status": "released", "event": event, "epsilon": 1.0, "delta": DELTA,
             "without_guarantee": [], "declared_disjoint": account == 1,
             "recorded_at": "2026-11-20T00:00:00", "context": {}}
            for i, account in enumerate([0, 0, 1])]
    legacy.write_text(json.dumps({"format": 1, "releases": rows}))
    ledger = SourceLedger(".dpfair/ledger.sqlite", tmp_path)
    imported = ledger.releases("loans")
    assert [r.id for r in imported] == ["r0", "r1", "r2"]
    assert imported[0].accounts == imported[1].accounts != imported[2].accounts
    assert not legacy.exists() and legacy.with_name(legacy.name + ".imported").exists()
    # what was spent before the upgrade still counts
    assert ledger.spent("loans", "v1", DELTA) == pytest.approx(
        accounting.epsilon(dp_event.ComposedDpEvent([EVENT, EVENT]), DELTA))
    assert len(SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases()) == 3


def test_a_dvc_temporary_workspace_uses_the_projects_stores(tmp_path):
    repo = tmp_path / "repo"
    workspace = repo / ".dvc" / "tmp" / "exps" / "tmpab12" / "sub"
    workspace.mkdir(parents=True)
    assert project_root(workspace) == repo.resolve()
    assert project_root(repo) == repo.resolve()
    assert ledger_url(".dpfair/ledger.sqlite", workspace) == (
        f"sqlite:///{repo.resolve()}/.dpfair/ledger.sqlite")
    assert durable_sqlite_uri("sqlite:///mlflow.db", workspace) == (
        f"sqlite:///{repo.resolve()}/mlflow.db")
    assert durable_sqlite_uri("http://host:5000", workspace) == "http://host:5000"


def test_passwords_are_masked():
    url = "postgresql+psycopg2://alice:s3cret@db.example:5432/dpfair"
    assert "s3cret" not in mask_password(url) and "alice" in mask_password(url)


_WRITER = """
import sys, time
from dp_accounting import dp_event
from dpfair.ledger import SourceLedger
from dpfair import accounting
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))  # every machine opens it at once
ledger = SourceLedger(sys.argv[1])
event = accounting.run_event(dp_event.GaussianDpEvent(1.0), 0.02, 200)
for i in range(3):
    ledger.reserve("loans", "v1", event, 1e-5, context={"worker": f"{sys.argv[2]}.{i}"})
print(ledger.secret().hex())
"""


def test_a_team_shares_one_ledger_on_a_database_server(postgres_url):
    """Three processes ("machines") open a new PostgreSQL ledger at the same moment (its
    tables are created once) and write to it at once: no release is lost, and all of them key
    people with the same project secret."""
    import time

    import sqlalchemy as sa

    server = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:  # a database of its own: the ledger is new
        conn.execute(sa.text("CREATE DATABASE team_ledger"))
    server.dispose()
    postgres_url = postgres_url.rsplit("/", 1)[0] + "/team_ledger"
    start = str(time.time() + 8)  # after every process has imported what it needs
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, postgres_url, str(w), start],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(3)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, [err for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1  # one secret for the team
    ledger = SourceLedger(postgres_url)
    workers = sorted(r.context["worker"] for r in ledger.releases("loans"))
    assert workers == sorted(f"{w}.{i}" for w in range(3) for i in range(3))
    assert ledger.spent("loans", "v1", DELTA) == pytest.approx(
        accounting.epsilon(dp_event.ComposedDpEvent([EVENT] * 9), DELTA))
    with pytest.raises(Exception, match="lifetime_epsilon"):
        ledger.reserve("loans", "v1", EVENT, DELTA, lifetime_epsilon=1.0)


_RESUMER = """
import sys, time
from dpfair.ledger import PrivacyGate
from dpfair.ledger.gate import DataVersion
from dpfair.release.plan import method_release, release_plan
from dpfair.config.sections import BudgetSection
from dpfair import accounting
from dp_accounting import dp_event
event = accounting.run_event(dp_event.GaussianDpEvent(1.0), 0.02, 200)
plan = release_plan([method_release("dpsgd", "proven", [0], [event], None, False, 1e-5)], 1e-5)
gate = PrivacyGate(BudgetSection(ledger=sys.argv[1]))
data = DataVersion("loans", "v1", "p1", {"row": ["a"]})
with gate.admit(plan, data, event=event, resumes="run-1"):
    print("claimed", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_crashed_run_is_resumed_by_one_process_only(tmp_path):
    """Two processes resume the same crashed pipeline run: the second is refused while the
    first holds the claim, and after the first has resumed it, it is not resumed again; a
    claim left by a killed process is taken over."""
    import signal
    import time

    from dpfair.config.sections import BudgetSection
    from dpfair.errors import PrivacyError
    from dpfair.ledger import PrivacyGate
    from dpfair.ledger.gate import DataVersion
    from dpfair.release.plan import method_release, release_plan

    where = str(tmp_path / "ledger.sqlite")
    first = subprocess.Popen([sys.executable, "-c", _RESUMER, where, "30"],
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "claimed"
    plan = release_plan([method_release("dpsgd", "proven", [0], [EVENT], None, False, DELTA)],
                        DELTA)
    gate = PrivacyGate(BudgetSection(ledger=where))
    data = DataVersion("loans", "v1", "p1", {"row": ["a"]})
    with pytest.raises(PrivacyError, match="claimed by process"):
        gate.admit(plan, data, event=EVENT, resumes="run-1")
    first.send_signal(signal.SIGKILL)  # dies holding the claim, its release pending
    first.wait(timeout=60)
    time.sleep(0.1)
    with gate.admit(plan, data, event=EVENT, resumes="run-1"):
        pass  # the dead process's claim is taken over; this resumption completes
    with pytest.raises(PrivacyError, match="resumed by another dpfair process"):
        gate.admit(plan, data, event=EVENT, resumes="run-1")
    statuses = [r.status for r in gate.ledger.releases()]
    assert statuses == ["pending", "released"]


_HOLDER = """
import sys, time
from dpfair.ledger.store import Store
Store(sys.argv[1], lease=2.0).claim("resume of pipeline run r1")
print("claimed", flush=True)
time.sleep(120)
"""


def test_a_dead_machines_claim_expires_and_a_live_ones_is_renewed(tmp_path, monkeypatch):
    """The first process claims a resumption and keeps renewing it; another machine is
    refused while it lives, and takes the claim over once its renewals stopped (SIGKILL: as
    a machine that died) for longer than the lease."""
    import signal
    import time

    import dpfair.processes
    from dpfair.errors import PrivacyError
    from dpfair.ledger.store import Store

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, url], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        monkeypatch.setattr(dpfair.processes, "host", lambda: "another-machine")
        other = Store(url, lease=2.0)
        for _ in range(3):  # renewed: still held after more than one lease
            with pytest.raises(PrivacyError, match="claimed by process .* expires after 2 s"):
                other.claim("resume of pipeline run r1")
            time.sleep(1.5)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        time.sleep(2.5)
        other.claim("resume of pipeline run r1")  # expired: taken over
        other.unclaim("resume of pipeline run r1")
    finally:
        holder.kill()


def test_a_sqlite_store_another_program_is_still_creating_is_opened_again(tmp_path):
    """A program that is not dpfair (``mlflow ui``, a notebook) takes no lock while it creates a
    fresh SQLite store's schema; dpfair's open meanwhile fails (MLflow: "out-of-date database
    schema") and is tried again under the lock until the schema is made."""
    from mlflow import MlflowClient

    url = f"sqlite:///{tmp_path / 'm.db'}"
    tries = []

    def open_store():
        tries.append(1)
        if len(tries) == 1:  # the other program is half-way through its migrations
            raise RuntimeError("Detected out-of-date database schema")
        return MlflowClient(tracking_uri=url).search_experiments(max_results=1)

    assert [e.name for e in open_racing(open_store, url)] == ["Default"]
    assert len(tries) == 2
