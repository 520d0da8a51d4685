"""The lifetime privacy ledger: every release on the people of the data, over time.

A run's budget (:mod:`dpfair.release.plan`) covers one run. Retraining every week on the same
people spends privacy again, and so does a copy of the same rows under another name. The
ledger keeps every release as its dp_accounting ``DpEvent`` (serialised by
:func:`dpfair.accounting.accountant.event_to_json`) in a durable SQL store
(:mod:`dpfair.ledger.store`) and refuses a release whose event, composed with everything
already spent on the same people, would exceed a lifetime ε (``BudgetExceededError``,
before anything trains).

**Accounts: who was charged.** An account is a set of people; every release is charged to
every account its data version touches, and each account is held to the lifetime ε on its
own. A data version's accounts are fixed when it is first seen:

* its named account (:mod:`dpfair.ledger.accounts`): the **project account** for every
  private source, unless a declaration names another (verified on person ids, else recorded
  as the user's attestation); a built-in public dataset's own account;
* the accounts of every recorded version that shares a row or person-id fingerprint with it
  (:mod:`dpfair.ledger.people`), an extra check: a fingerprint never makes an account new;
* plus, unless declared disjoint, the accounts of its source's latest release;
* a version declared disjoint (``budget.disjoint_from_previous``) that shares a fingerprint
  with an earlier version of its source is refused, and so is a declared account whose person
  ids are in another account: the declaration is false.

The spend of an account is the accountant's ε of the composition of its events at the new
release's δ (:func:`dpfair.accounting.accountant.epsilon`), never a sum of epsilons. Releases
without a guarantee carry their label, not an ε.

**When a release counts.** :meth:`SourceLedger.reserve` checks and records the planned
release as ``pending`` in one locked transaction, before anything trains. It is then settled
``released`` (complete), ``failed`` (it may have released something: it counts, but it is not
a completed release of its version, so a scheduled retrain of that version is retried and
charged again) or ``void`` (nothing left the process: it does not count). A killed process
leaves ``pending``, which counts in full.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from dp_accounting import dp_event

from dpfair import accounting
from dpfair.errors import BudgetExceededError, PrivacyError
from dpfair.ledger.accounts import PROJECT_ACCOUNT, Account, account_id
from dpfair.ledger.people import Fingerprints
from dpfair.ledger.store import Store, import_json_ledger, ledger_url, legacy_json

__all__ = ["Release", "SourceLedger", "Spending", "Status"]

Status = Literal["pending", "released", "failed", "void"]


@dataclass(frozen=True)
class Release:
    """One release on data ``source`` at ``version``, charged to ``accounts``: ``event``
    (JSON of its DpEvent), its ε at ``delta`` when recorded, and ``without_guarantee``: one
    label per release that has no ε."""

    id: str
    source: str
    version: str
    accounts: tuple[int, ...]
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
        """Whether this release is spent (released, failed or pending: possibly released)."""
        return self.status != "void"

    def dp_event(self) -> dp_event.DpEvent:
        return accounting.event_from_json(self.event)


def _fmt(eps: float) -> str:
    return f"{eps:.3g}" if math.isfinite(eps) else "∞"


class SourceLedger:
    """The ledger at ``location``: an SQLAlchemy URL, or a path (relative: to the project
    root, :func:`dpfair.workspace.durable_path`) of a SQLite file. A JSON ledger of earlier
    versions under ``root`` is imported on first use."""

    def __init__(self, location: str | Path, root: str | Path | None = None) -> None:
        self.store = Store(ledger_url(str(location), root))
        self.path = self.store.display
        import_json_ledger(self.store, legacy_json(root))

    # ---------------------------------------------------------------------------- reading

    def releases(self, source: str | None = None) -> list[Release]:
        """Every release recorded (of ``source`` if given), oldest first, voided ones too."""
        with self.store.reading() as conn:
            return [Release(**row) for row in Store.release_rows(conn, source)]

    def latest_version(self, source: str) -> str | None:
        """The data version of the latest *completed* release of ``source`` (None: none):
        pending and failed releases count against the budget but complete nothing."""
        done = [r for r in self.releases(source) if r.status == "released"]
        return done[-1].version if done else None

    def secret(self) -> bytes:
        """The project secret (:meth:`Store.secret`): never log or publish it."""
        return self.store.secret()

    def _accounts(self, conn: sa.Connection, source: str, version: str,
                  fingerprints: Fingerprints | None, disjoint: bool, account: Account
                  ) -> tuple[set[int], bool]:
        """The accounts a release at ``version`` is charged to, and whether the version is new
        (module docstring, :mod:`dpfair.ledger.accounts`). Raises for a false declaration."""
        known = Store.version_row(conn, version)
        if known is not None:
            return set(known["accounts"]), False
        found = {account_id(conn, account.name)}
        same_source: list[str] = []
        for other in Store.overlapping(conn, fingerprints or {}):
            row = Store.version_row(conn, other)
            if row is None:
                continue
            found |= set(row["accounts"])
            if row["source"] == source:
                same_source.append(other[:12])
        if disjoint and same_source:
            raise PrivacyError(
                f"budget.disjoint_from_previous is set, but this version of {source!r} shares "
                f"rows or person ids with earlier versions ({', '.join(same_source)}). Its "
                "people were already released on, so it cannot start an account of its own. "
                "Fix: remove budget.disjoint_from_previous (the release then composes with "
                "the earlier ones), or remove the earlier rows from the new data")
        if account.declared:
            self._verify(conn, account, fingerprints or {})
        if not disjoint:
            counted = [r for r in Store.release_rows(conn, source) if r["status"] != "void"]
            if counted:
                found |= set(counted[-1]["accounts"])
        return found, True

    @staticmethod
    def _verify(conn: sa.Connection, account: Account, fingerprints: Fingerprints) -> None:
        """Refuse a declared account whose person ids are in another account already."""
        own = account_id(conn, account.name)
        shared = [v for v in Store.overlapping(conn, {"id": fingerprints.get("id", [])})
                  if (row := Store.version_row(conn, v)) is not None
                  and own not in row["accounts"]]
        if shared:
            raise PrivacyError(
                f"{account.name!r} is declared an account of its own, but person ids of this "
                f"data are in other accounts already (versions {', '.join(s[:12] for s in shared)})"
                ": those people were released on there. Fix: remove the declaration (the data "
                "then draws on the account of those people), or remove their rows")

    def _account_releases(self, conn: sa.Connection, accounts: set[int]
                          ) -> dict[int, list[Release]]:
        rows = [Release(**r) for r in Store.release_rows(conn) if r["status"] != "void"]
        return {a: [r for r in rows if a in r.accounts] for a in sorted(accounts)}

    def spent(self, source: str, version: str, delta: float, disjoint: bool = False,
              fingerprints: Fingerprints | None = None, account: Account = PROJECT_ACCOUNT
              ) -> float:
        """ε at ``delta`` already spent on the people a release at ``version`` touches (the
        most spent account)."""
        with self.store.reading() as conn:
            accounts, _ = self._accounts(conn, source, version, fingerprints, disjoint,
                                         account)
            by_account = self._account_releases(conn, accounts)
        return max((_composed_epsilon(rs, (), delta) for rs in by_account.values()),
                   default=0.0)

    # ---------------------------------------------------------------------------- writing

    def reserve(
        self,
        source: str,
        version: str,
        event: dp_event.DpEvent,
        delta: float,
        *,
        fingerprints: Fingerprints | None = None,
        lifetime_epsilon: float | None = None,
        epsilon: float | None = None,
        disjoint: bool = False,
        account: Account = PROJECT_ACCOUNT,
        without_guarantee: Sequence[str] = (),
        context: Mapping[str, str] | None = None,
    ) -> Release:
        """Check the lifetime budget of every account ``version`` touches and record ``event``
        as a pending release, in one locked transaction. ``BudgetExceededError`` (naming the
        spend so far and what this release adds) when an account would exceed
        ``lifetime_epsilon``; nothing is recorded then."""
        with self.store.locked() as conn:
            return self._record(conn, source, version, event, delta, fingerprints=fingerprints,
                                lifetime_epsilon=lifetime_epsilon, epsilon=epsilon,
                                disjoint=disjoint, account=account,
                                without_guarantee=without_guarantee, context=context)

    def reserve_once(self, key: str, source: str, version: str, event: dp_event.DpEvent,
                     delta: float, **options: Any) -> Release | None:
        """:meth:`reserve`, unless a release that counts holds the reservation ``key`` (e.g. a
        search's identity: two ``dpfair tune`` of one study started together charge it once):
        then nothing is recorded and None is returned (the caller joins the reserved release).
        The key is unique in the store: the lookup and the INSERT run in the reservation's
        locked transaction, and an INSERT that loses a race anyway (``IntegrityError``) rolls
        the whole reservation back."""
        try:
            with self.store.locked() as conn:
                held = Store.keyed_release(conn, key)
                if held is not None and held["status"] != "void":
                    return None
                release = self._record(conn, source, version, event, delta, **options)
                Store.hold_key(conn, key, release.id)
        except sa.exc.IntegrityError:
            with self.store.reading() as conn:
                held = Store.keyed_release(conn, key)
            if held is None or held["status"] == "void":
                raise
            return None  # the other process's reservation won the race
        return release

    def _record(self, conn: sa.Connection, source: str, version: str,
                event: dp_event.DpEvent, delta: float, *,
                fingerprints: Fingerprints | None = None,
                lifetime_epsilon: float | None = None, epsilon: float | None = None,
                disjoint: bool = False, account: Account = PROJECT_ACCOUNT,
                without_guarantee: Sequence[str] = (),
                context: Mapping[str, str] | None = None) -> Release:
        """The body of :meth:`reserve`, inside its locked transaction ``conn``."""
        own = accounting.epsilon(event, delta) if epsilon is None else epsilon
        accounts, new = self._accounts(conn, source, version, fingerprints, disjoint,
                                       account)
        if lifetime_epsilon is not None:  # without a limit nothing needs the composition
            by_account = self._account_releases(conn, accounts)
            totals = {a: _composed_epsilon(rs, [event], delta) if rs else own
                      for a, rs in by_account.items()}
            worst = max(totals, key=lambda a: totals[a])
            if not totals[worst] <= lifetime_epsilon:
                raise BudgetExceededError(self._refusal(
                    source, version, by_account[worst], own, totals[worst], delta,
                    lifetime_epsilon, len(accounts)))
        if new:
            Store.add_version(conn, version, source, accounts, fingerprints or {}, disjoint)
        row = {
            "id": uuid.uuid4().hex, "source": source, "version": version,
            "accounts": sorted(accounts), "status": "pending",
            "event": accounting.event_to_json(event), "epsilon": own, "delta": delta,
            "without_guarantee": list(without_guarantee), "declared_disjoint": disjoint,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "context": {"host": socket.gethostname(), "pid": str(os.getpid()),
                        "account": account.name,
                        **({"declaration": account.declaration} if account.declared else {}),
                        **dict(context or {})},
        }
        Store.insert_release(conn, row)
        return Release(**{**row, "accounts": tuple(row["accounts"]),
                          "without_guarantee": tuple(without_guarantee)})

    def settle(self, release_id: str, status: Status, **context: str) -> Release:
        """Mark a pending release ``released``, ``failed`` or ``void`` (module docstring),
        adding ``context`` (e.g. the MLflow run id)."""
        with self.store.locked() as conn:
            old = next((r for r in Store.release_rows(conn) if r["id"] == release_id), None)
            if old is None:
                raise PrivacyError(f"no release {release_id!r} in the privacy ledger "
                                   f"{self.path}")
            merged = {**old["context"], **context}
            Store.update_release(conn, release_id, status, merged)
        return Release(**{**old, "status": status, "context": merged})

    def spending(self, release: Release) -> Spending:
        """A context that settles ``release`` when it ends (:class:`Spending`)."""
        return Spending(self, release)

    def _refusal(self, source: str, version: str, account: Sequence[Release], own: float,
                 total: float, delta: float, lifetime: float, n_accounts: int) -> str:
        spent = _composed_epsilon(account, (), delta)
        lines = [f"{r.recorded_at} {r.source} version {r.version[:12]}: ε {_fmt(r.epsilon)} "
                 f"at δ = {r.delta:g} ({r.status})"
                 + (f"; {r.context['declaration']}" if "declaration" in r.context else "")
                 for r in account]
        other = [r.source for r in account if r.source != source]
        shared = (f"  (these people are also in: {', '.join(sorted(set(other)))})\n"
                  if other else "")
        return (
            f"a release on data source {source!r} (version {version[:12]}) would exceed "
            f"budget.lifetime_epsilon {lifetime:g} at δ = {delta:g}; nothing was trained.\n"
            f"  spent so far on these people: ε {_fmt(spent)} in {len(account)} release(s)"
            f"{f' (the most spent of {n_accounts} accounts it touches)' if n_accounts > 1 else ''}"
            "\n" + "".join(f"    {line}\n" for line in lines) + shared
            + f"  this release adds: ε {_fmt(own)} on its own; composed with the spend so far: "
            f"ε {_fmt(total)} (the accountant's composition, not a sum of epsilons)\n"
            f"fix: release less (fewer seeds or methods, fewer epochs, larger sigma), raise "
            f"budget.lifetime_epsilon, or, only if the data holds no one from the releases "
            f"above, declare it: datasets.<name>.privacy_unit.account (its own account, "
            f"checked on id_column) or budget.disjoint_from_previous: true for a new version "
            f"(ledger: {self.path})"
        )


def _composed_epsilon(releases: Sequence[Release], extra: Sequence[dp_event.DpEvent],
                      delta: float) -> float:
    if not releases and not extra:
        return 0.0
    if len(releases) == 1 and not extra and releases[0].delta == delta:
        return releases[0].epsilon
    composed = dp_event.ComposedDpEvent([*(r.dp_event() for r in releases), *extra])
    return accounting.epsilon(composed, delta)


class Spending:
    """Settles a pending release when the block ends: ``released`` when the block completes,
    ``failed`` when it raises after :meth:`may_release` (something the release covers may
    have left the process), ``void`` when it raises before. ``context`` is recorded with it."""

    def __init__(self, ledger: SourceLedger, release: Release) -> None:
        self.ledger, self.release = ledger, release
        self.context: dict[str, str] = {}
        self.claims: list[str] = []  # claims in the store, given back when the block ends
        self._started = False

    def may_release(self) -> None:
        self._started = True

    def __enter__(self) -> Spending:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc_type is None:
            status: Status = "released"
        else:
            self.context["error"] = f"{exc_type.__name__}: {exc}"[:500]
            status = "failed" if self._started else "void"
        try:
            self.ledger.settle(self.release.id, status, **self.context)
        finally:
            for claim in self.claims:
                self.ledger.store.unclaim(claim)

