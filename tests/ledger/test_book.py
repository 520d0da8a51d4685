"""The lifetime privacy ledger (dpfair/ledger/book.py): composition by the accountant, the
lifetime budget, accounts of disjoint versions, restarts, concurrent writers."""

from __future__ import annotations

import subprocess
import sys

import pytest
from dp_accounting import dp_event

from dpfair import accounting
from dpfair.config.sections import BudgetSection
from dpfair.errors import BudgetExceededError, PrivacyError
from dpfair.ledger import PrivacyGate, SourceLedger
from dpfair.ledger.accounts import Account, account_of
from dpfair.ledger.gate import DataVersion
from dpfair.release.plan import method_release, release_plan
from tests.conftest import epsilon_oracle

DELTA = 1e-5


def _run(sigma: float = 1.0, steps: int = 200) -> dp_event.DpEvent:
    return accounting.run_event(dp_event.GaussianDpEvent(sigma), 0.02, steps)


def _oracle(*events: dp_event.DpEvent) -> float:
    return epsilon_oracle(*events, delta=DELTA)


def test_spend_is_the_accountants_composition_not_a_sum(tmp_path):
    ledger = SourceLedger(tmp_path / "ledger.sqlite")
    events = [_run(1.0), _run(1.5, 300), _run(0.9, 100)]
    for i, event in enumerate(events):
        ledger.reserve("loans", f"v{i}", event, DELTA)
    spent = ledger.spent("loans", "v3", DELTA)
    assert spent == pytest.approx(_oracle(*events), rel=1e-4)
    assert spent < sum(_oracle(e) for e in events)
    assert [r.epsilon for r in ledger.releases("loans")] == pytest.approx(
        [_oracle(e) for e in events], rel=1e-4)
    # other private data, no declaration: nothing proves other people, the project account
    assert ledger.spent("other", "w0", DELTA) == pytest.approx(spent)
    own = Account("declared:other", "declared by a test")
    assert ledger.spent("other", "w0", DELTA, account=own) == 0.0  # declared apart
    # the same file (same md5) under another name: the same people
    assert ledger.spent("other", "v0", DELTA) == pytest.approx(spent)


def test_lifetime_budget_refuses_before_recording_and_names_the_spend(tmp_path):
    ledger = SourceLedger(tmp_path / "ledger.sqlite")
    event = _run()
    one, two, three = _oracle(event), _oracle(event, event), _oracle(event, event, event)
    lifetime = (two + three) / 2
    ledger.reserve("loans", "v1", event, DELTA, lifetime_epsilon=lifetime)
    ledger.reserve("loans", "v2", event, DELTA, lifetime_epsilon=lifetime)
    with pytest.raises(BudgetExceededError) as err:
        ledger.reserve("loans", "v3", event, DELTA, lifetime_epsilon=lifetime)
    message = str(err.value)
    assert f"budget.lifetime_epsilon {lifetime:g}" in message
    assert f"spent so far on these people: ε {two:.3g} in 2 release(s)" in message
    assert f"this release adds: ε {one:.3g} on its own" in message
    assert f"ε {three:.3g}" in message and "nothing was trained" in message
    assert "disjoint_from_previous" in message
    assert len(ledger.releases("loans")) == 2


def test_ledger_survives_a_restart(tmp_path):
    path = tmp_path / "state" / "ledger.sqlite"
    SourceLedger(path).reserve("loans", "v1", _run(), DELTA)
    SourceLedger(path).reserve("loans", "v2", _run(), DELTA)
    expected = _oracle(_run(), _run())
    assert SourceLedger(path).spent("loans", "v2", DELTA) == pytest.approx(expected, rel=1e-4)
    code = ("import sys; from dpfair.ledger import SourceLedger; "
            f"print(SourceLedger(sys.argv[1]).spent('loans', 'v2', {DELTA}))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True, timeout=120)
    assert float(out.stdout) == pytest.approx(expected, rel=1e-4)


def test_disjoint_versions_start_their_own_account(tmp_path):
    ledger = SourceLedger(tmp_path / "ledger.sqlite")
    a, b = _run(1.0), _run(2.0)
    ledger.reserve("loans", "v1", a, DELTA)
    ledger.reserve("loans", "v2", a, DELTA)  # same people by default
    assert ledger.spent("loans", "v2", DELTA) == pytest.approx(_oracle(a, a), rel=1e-4)
    lifetime = _oracle(a, a) * 1.01
    # new customers only: a separate account, so the first account's spend does not count
    apart = account_of("loans", None, "v3", disjoint=True)
    assert apart.declared and "disjoint_from_previous" in apart.declaration
    assert ledger.spent("loans", "v3", DELTA, disjoint=True, account=apart) == 0.0
    new = ledger.reserve("loans", "v3", b, DELTA, lifetime_epsilon=lifetime, disjoint=True,
                         account=apart)
    assert new.declared_disjoint and new.accounts != ledger.releases("loans")[0].accounts
    assert new.context["declaration"] == apart.declaration  # the attestation, recorded
    # the next version (not declared) is the project's and holds v3's people too
    ledger.reserve("loans", "v4", b, DELTA)
    assert ledger.spent("loans", "v4", DELTA) == pytest.approx(_oracle(a, a, b), rel=1e-4)
    # retraining on v1's data goes back to v1's account (the project's), even if declared
    assert ledger.spent("loans", "v1", DELTA, disjoint=True, account=apart) == pytest.approx(
        _oracle(a, a, b), rel=1e-4)
    with pytest.raises(BudgetExceededError):
        ledger.reserve("loans", "v1", a, DELTA, lifetime_epsilon=lifetime, disjoint=True)


def test_void_releases_do_not_count_pending_ones_do(tmp_path):
    ledger = SourceLedger(tmp_path / "ledger.sqlite")
    event = _run()
    crashed_early = ledger.reserve("loans", "v1", event, DELTA)
    with pytest.raises(RuntimeError), ledger.spending(crashed_early):
        raise RuntimeError("MLflow unreachable")  # before anything could be released
    failed_late = ledger.reserve("loans", "v1", event, DELTA)
    with pytest.raises(RuntimeError), ledger.spending(failed_late) as spend:
        spend.may_release()
        raise RuntimeError("a training failed after logging epochs")
    ledger.reserve("loans", "v2", event, DELTA)  # a killed run: stays pending
    statuses = [(r.status, r.context.get("error", "")) for r in ledger.releases("loans")]
    assert statuses == [("void", "RuntimeError: MLflow unreachable"),
                        ("failed", "RuntimeError: a training failed after logging epochs"),
                        ("pending", "")]
    assert ledger.spent("loans", "v2", DELTA) == pytest.approx(_oracle(event, event), rel=1e-4)
    # neither a failed nor a pending release completes its version: a retrain retries it
    assert ledger.latest_version("loans") is None
    done = ledger.reserve("loans", "v2", event, DELTA)
    with ledger.spending(done):
        pass
    assert ledger.latest_version("loans") == "v2"


def test_a_plans_releases_without_guarantee_carry_a_label(tmp_path):
    run = _run()
    private = method_release("dpsgd", "proven", [0, 1], [run, run], None, False, DELTA)
    reference = method_release("nonprivate", "none", [0, 1],
                               [dp_event.NonPrivateDpEvent()] * 2, None, False, DELTA)
    plan = release_plan([reference, private], DELTA)
    where = str(tmp_path / "ledger.sqlite")

    def gate(**budget: object) -> PrivacyGate:
        return PrivacyGate(BudgetSection(allow_nonprivate_reference=True, ledger=where,
                                         **budget))

    v1 = DataVersion("loans", "v1", "p1", {"row": ["r1", "r2"]})
    release = gate(lifetime_epsilon=plan.epsilon_total * 1.01).admit(plan, v1).release
    assert release.epsilon == pytest.approx(_oracle(run, run), rel=1e-4)
    assert release.without_guarantee == ("nonprivate: non-private reference: no DP guarantee",)
    assert "NonPrivate" not in SourceLedger(where).releases()[0].event
    v2 = DataVersion("loans", "v2", "p2", {"row": ["r3"]})
    with pytest.raises(BudgetExceededError):
        gate(lifetime_epsilon=release.epsilon).admit(plan, v2)
    disjoint = gate(lifetime_epsilon=release.epsilon * 1.01, disjoint_from_previous=True)
    v2 = DataVersion("loans", "v2", "p2", {"row": ["r3"]},
                     account_of("loans", None, "p2", disjoint=True))
    assert disjoint.admit(plan, v2).release.accounts != release.accounts


# Each writer process: three reserves (argv: ledger path, worker index).
_WRITER = """
import sys
from dp_accounting import dp_event
from dpfair import accounting
from dpfair.ledger import SourceLedger
ledger = SourceLedger(sys.argv[1])
for i in range(3):
    event = accounting.run_event(dp_event.GaussianDpEvent(1.0), 0.02, 200)
    ledger.reserve("loans", "v1", event, 1e-5, context={"worker": f"{sys.argv[2]}.{i}"})
"""


def test_concurrent_writers_lose_no_release(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, str(w)],
                              stderr=subprocess.PIPE, text=True) for w in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 3, errors
    workers = sorted(r.context["worker"] for r in SourceLedger(path).releases())
    assert workers == sorted(f"{w}.{i}" for w in range(3) for i in range(3))


def test_an_unreadable_ledger_stops_everything(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_text("not a database")
    with pytest.raises(PrivacyError, match="cannot be opened.*nothing may train"):
        SourceLedger(path).reserve("loans", "v1", _run(), DELTA)
