"""A cumulative privacy ledger per data source: every release over time (issue #16, item 6).

A pipeline run's privacy budget (:mod:`dpfair.release`) covers one run. Retraining every week
on a source that holds the same people spends privacy again: the releases of all the runs
compose. The ledger keeps, per data source, every release as its dp_accounting ``DpEvent``
(serialised by :func:`dpfair.privacy.accounting.event_to_json`) in one JSON file that
survives restarts, and refuses a retrain whose release, composed with everything already spent
on the same people, would exceed a lifetime ε (:class:`~dpfair.errors.BudgetExceededError`,
before anything trains).

**Accounts.** The releases that compose are those of one *account*. By default every version
of a source holds the same people, so a new version joins the source's current account. A
version declared disjoint from the previous ones (it holds only people no earlier version
held, e.g. new customers only) opens a new account: disjoint data compose in parallel, so each
account is held to the lifetime ε on its own. A version already in the ledger always goes back
to its own account (retraining on the same data spends on the same people). The spend of an
account is the accountant's ε of the composition of its events at the new release's δ
(:func:`dpfair.privacy.accounting.epsilon`, RDP), never a sum of epsilons. Releases without a
guarantee (the non-private reference, heuristic methods) carry their label, not an ε.

**When a release counts.** :meth:`SourceLedger.reserve` checks the budget and records the
planned release as ``pending`` in one locked step, before anything trains, so two retrains
started together cannot both pass the check. :meth:`SourceLedger.settle` then marks it
``released`` (models and metrics left the process) or ``void`` (the run stopped before it
released anything: only then it does not count). A run that fails after its trainings started
counts in full: a failed training may already have logged per-epoch metrics, which its event
covers. A killed process leaves its release ``pending``, which counts in full: what it
released before it died cannot be known, so the ledger assumes all of it.

The file is written by atomic replace under a file lock (``<path>.lock``), so concurrent
writers (several processes or hosts on a shared disk with working locks) never lose a release
and a crash never leaves it half-written.
"""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dp_accounting import dp_event
from filelock import FileLock

from dpfair.errors import BudgetExceededError, PrivacyError
from dpfair.privacy import accounting

if TYPE_CHECKING:
    from dpfair.release import ReleasePlan
    from dpfair.sections import BudgetSection

__all__ = ["FORMAT", "Release", "SourceLedger", "Spending", "Status", "reserve", "reserve_plan"]

FORMAT = 1
Status = Literal["pending", "released", "void"]


@dataclass(frozen=True)
class Release:
    """One release on data ``source`` at ``version``: ``event`` (JSON of its DpEvent, the
    composition of its releases that have a guarantee), their ε at ``delta`` when recorded,
    and ``without_guarantee``: one label per release that has no ε."""

    id: str
    source: str
    version: str
    account: int
    status: Status
    event: str
    epsilon: float
    delta: float
    without_guarantee: tuple[str, ...] = ()
    declared_disjoint: bool = False
    recorded_at: str = ""
    context: dict[str, str] = field(default_factory=dict)

    @property
    def counts(self) -> bool:
        """Whether this release is spent (released, or pending: possibly released)."""
        return self.status != "void"

    def dp_event(self) -> dp_event.DpEvent:
        return accounting.event_from_json(self.event)

    def _as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["event"] = json.loads(self.event)
        data["without_guarantee"] = list(self.without_guarantee)
        return data

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> Release:
        return cls(**{**data, "event": json.dumps(data["event"]),
                      "without_guarantee": tuple(data.get("without_guarantee", ()))})


def _fmt(eps: float) -> str:
    return f"{eps:.3g}" if math.isfinite(eps) else "∞"


class SourceLedger:
    """The ledger in the JSON file ``path`` (created on the first release)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = FileLock(f"{self.path}.lock", timeout=60)

    # ---------------------------------------------------------------------------- reading

    def _load(self) -> list[Release]:
        if not self.path.is_file():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            return [Release._from_json(r) for r in data["releases"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise PrivacyError(
                f"the privacy ledger {self.path} cannot be read ({exc}): it records what was "
                "already spent, so nothing may train until it is repaired from a backup "
                "(budget.ledger names its path)") from None

    def _save(self, releases: Sequence[Release]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": FORMAT, "releases": [r._as_json() for r in releases]}
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def releases(self, source: str | None = None) -> list[Release]:
        """Every release recorded (of ``source`` if given), oldest first, voided ones too."""
        with self._lock:
            found = self._load()
        return [r for r in found if source is None or r.source == source]

    def latest_version(self, source: str) -> str | None:
        """The data version of the latest completed release of ``source``, or None (a
        pending one, e.g. of a killed run, counts against the budget but is not complete)."""
        done = [r for r in self.releases(source) if r.status == "released"]
        return done[-1].version if done else None

    @staticmethod
    def _account_of(releases: Sequence[Release], version: str, disjoint: bool) -> int:
        counted = [r for r in releases if r.counts]
        same = [r.account for r in counted if r.version == version]
        if same:  # data already released on: the same people
            return same[-1]
        if not counted:
            return 0
        return max(r.account for r in counted) + 1 if disjoint else counted[-1].account

    def account(self, source: str, version: str, disjoint: bool = False) -> list[Release]:
        """The releases a new release of ``source`` at ``version`` composes with."""
        releases = self.releases(source)
        number = self._account_of(releases, version, disjoint)
        return [r for r in releases if r.counts and r.account == number]

    @staticmethod
    def _composed(releases: Sequence[Release], extra: Sequence[dp_event.DpEvent] = ()
                  ) -> dp_event.DpEvent:
        return dp_event.ComposedDpEvent([*(r.dp_event() for r in releases), *extra])

    def spent(self, source: str, version: str, delta: float, disjoint: bool = False) -> float:
        """ε at ``delta`` of everything a new release at ``version`` composes with."""
        account = self.account(source, version, disjoint)
        if len(account) == 1 and account[0].delta == delta:
            return account[0].epsilon
        return accounting.epsilon(self._composed(account), delta) if account else 0.0

    # ---------------------------------------------------------------------------- writing

    def reserve(
        self,
        source: str,
        version: str,
        event: dp_event.DpEvent,
        delta: float,
        *,
        lifetime_epsilon: float | None = None,
        epsilon: float | None = None,
        disjoint: bool = False,
        without_guarantee: Sequence[str] = (),
        context: Mapping[str, str] | None = None,
    ) -> Release:
        """Check the lifetime budget and record ``event`` as a pending release of
        ``source`` at ``version``, in one locked step. Raises ``BudgetExceededError`` (naming
        the spend so far and what this release adds) when the account's composition with
        ``event`` would exceed ``lifetime_epsilon``; nothing is recorded then. ``epsilon``:
        the event's own ε at ``delta`` when the caller has it already."""
        with self._lock:
            releases = self._load()
            mine = [r for r in releases if r.source == source]
            number = self._account_of(mine, version, disjoint)
            account = [r for r in mine if r.counts and r.account == number]
            own = accounting.epsilon(event, delta) if epsilon is None else epsilon
            total = accounting.epsilon(self._composed(account, [event]), delta) if account else own
            if lifetime_epsilon is not None and not total <= lifetime_epsilon:
                raise BudgetExceededError(self._refusal(source, version, account, own, total,
                                                        delta, lifetime_epsilon))
            release = Release(
                id=uuid.uuid4().hex, source=source, version=version, account=number,
                status="pending", event=accounting.event_to_json(event), epsilon=own,
                delta=delta, without_guarantee=tuple(without_guarantee),
                declared_disjoint=disjoint, recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                context={"host": socket.gethostname(), "pid": str(os.getpid()),
                         **dict(context or {})},
            )
            self._save([*releases, release])
        return release

    def settle(self, release_id: str, released: bool, **context: str) -> Release:
        """Mark a pending release ``released`` (it counts) or ``void`` (nothing left the
        process: it no longer counts), adding ``context`` (e.g. the MLflow run id)."""
        with self._lock:
            releases = self._load()
            index = next((i for i, r in enumerate(releases) if r.id == release_id), None)
            if index is None:
                raise PrivacyError(f"no release {release_id!r} in the privacy ledger {self.path}")
            old = releases[index]
            releases[index] = Release(**{**asdict(old), "status": "released" if released
                                         else "void", "context": {**old.context, **context}})
            self._save(releases)
        return releases[index]

    def spending(self, release: Release) -> Spending:
        """A context that settles ``release`` when it ends (:class:`Spending`)."""
        return Spending(self, release)

    def _refusal(self, source: str, version: str, account: Sequence[Release], own: float,
                 total: float, delta: float, lifetime: float) -> str:
        spent = accounting.epsilon(self._composed(account), delta) if account else 0.0
        lines = [f"{r.recorded_at} version {r.version[:12]}: ε {_fmt(r.epsilon)} at δ = "
                 f"{r.delta:g} ({r.status})" for r in account]
        return (
            f"retraining on data source {source!r} (version {version[:12]}) would exceed "
            f"budget.lifetime_epsilon {lifetime:g} at δ = {delta:g}; nothing was trained.\n"
            f"  spent so far on these people: ε {_fmt(spent)} in {len(account)} release(s)\n"
            + "".join(f"    {line}\n" for line in lines)
            + f"  this retrain adds: ε {_fmt(own)} on its own; composed with the spend so far: "
            f"ε {_fmt(total)} (RDP accountant, not a sum of epsilons)\n"
            f"fix: release less (fewer seeds or methods, fewer epochs, larger sigma), raise "
            f"budget.lifetime_epsilon, or, only if the new data holds no one from earlier "
            f"versions, declare it with budget.disjoint_from_previous: true (ledger: {self.path})"
        )


class Spending:
    """Settles a pending release when the block ends: ``released`` when the block completes or
    raises after :meth:`may_release` (something the release covers may have left the
    process), ``void`` when it raises before. ``context`` is recorded with it."""

    def __init__(self, ledger: SourceLedger, release: Release) -> None:
        self.ledger, self.release = ledger, release
        self.context: dict[str, str] = {}
        self._started = False

    def may_release(self) -> None:
        self._started = True

    def __enter__(self) -> Spending:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc_type is not None:
            self.context["error"] = f"{exc_type.__name__}: {exc}"[:500]
        self.ledger.settle(self.release.id, released=exc_type is None or self._started,
                           **self.context)


def reserve_plan(ledger: SourceLedger, source: str, version: str, plan: ReleasePlan,
                 budget: BudgetSection, **context: str) -> Release:
    """Reserve a pipeline run's whole release (:class:`dpfair.release.ReleasePlan`) on
    ``source`` at ``version`` against ``budget.lifetime_epsilon``, with
    ``budget.disjoint_from_previous``: its private releases and its noisy test metrics
    (:attr:`ReleasePlan.ledger_event`); releases without a guarantee are recorded by label."""
    return reserve(
        ledger, source, version, plan.ledger_event, plan.delta, budget,
        epsilon=None if plan.test_noisy else plan.epsilon_total,
        without_guarantee=[f"{m.label}: {m.no_epsilon_label}" for m in plan.without_guarantee],
        **context,
    )


def reserve(ledger: SourceLedger, source: str, version: str, event: dp_event.DpEvent,
            delta: float, budget: BudgetSection, *, epsilon: float | None = None,
            without_guarantee: Sequence[str] = (), **context: str) -> Release:
    """Reserve ``event`` (one command's release: ``dpfair train``, ``dpfair tune``, a
    pipeline run) as :meth:`SourceLedger.reserve` does, with ``budget``'s lifetime ε and
    ``disjoint_from_previous``."""
    return ledger.reserve(
        source, version, event, delta, epsilon=epsilon,
        lifetime_epsilon=budget.lifetime_epsilon, disjoint=budget.disjoint_from_previous,
        without_guarantee=without_guarantee, context=context,
    )
