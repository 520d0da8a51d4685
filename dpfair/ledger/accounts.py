"""Which account a data version draws on: one project account unless declared otherwise.

Nothing proves that two tables hold different people unless their person ids say so: the same
people under a new name, with a column renamed or dropped, a feature added or a value edited
have new bytes and new row fingerprints. So the account is not found from the bytes:

* every **private** source (a ``kind:`` dataset, the data given to :func:`dpfair.api.fit`)
  draws on the **project account** (``project``);
* a **built-in** public dataset (``digits``, ``adult``, ...) is a distinct source by definition
  and has an account of its own (``public:<name>``);
* a source whose ``privacy_unit.account`` names an account (``declared:<name>``), or a new
  version under ``budget.disjoint_from_previous`` (``version:<source>:<version>``), draws on
  its own account **by declaration**: verified on the person ids where the table has an
  ``id_column`` (an id already in another account refuses the declaration), else recorded
  with each release as the user's attestation (what, when, which command).

Row and id fingerprints stay an extra check: a version that shares one with a version of
another account is charged to that account too (:meth:`SourceLedger.reserve`).

Ledgers written before named accounts are migrated on first use without losing a charge: every
earlier release on a private source is added to the project account (so its spend is the
composition of all of them), and a built-in source keeps the account of its latest release.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from dpfair.ledger.store import META, RELEASES, VERSIONS, Store

__all__ = ["PROJECT", "PROJECT_ACCOUNT", "Account", "account_id", "account_of"]

PROJECT = "project"
_NAMES = "accounts"  # META key: JSON {account name: account number}


@dataclass(frozen=True)
class Account:
    """The account a data version draws on: ``name`` (``project``, ``public:<dataset>``,
    ``declared:<name>``, ``version:<source>:<id>``) and, for a declaration, what was declared
    (``declaration``, shown with every ε it affects)."""

    name: str
    declaration: str | None = None

    @property
    def declared(self) -> bool:
        return self.declaration is not None

    def describe(self) -> str:
        if self.name == PROJECT:
            return "the project account (every private source without a declaration)"
        if self.name.startswith("public:"):
            return f"the built-in public dataset {self.name[7:]!r}'s own account"
        return f"account {self.name!r}, {self.declaration}"


PROJECT_ACCOUNT = Account(PROJECT)


def account_of(name: str, options: Any, public_id: str, *, disjoint: bool = False,
               command: str = "") -> Account:
    """The account of version ``public_id`` of source ``name`` loaded with ``options`` (None:
    data given in Python); ``disjoint``: ``budget.disjoint_from_previous`` (module
    docstring)."""
    from dpfair.data.registry import specs

    kind = getattr(options, "kind", None)
    if options is not None and kind is None and name in specs():
        return Account(f"public:{name}")
    unit = getattr(options, "privacy_unit", None)
    ids = getattr(options, "id_column", None)
    how = ("checked on its person ids" if ids else
           "not verifiable (no id_column): your attestation") + (f", by {command}" if command
                                                                  else "")
    if unit is not None and unit.account is not None:
        return Account(f"declared:{unit.account}",
                       f"declared by datasets.{name}.privacy_unit.account ({how})")
    if disjoint:
        return Account(f"version:{name}:{public_id[:12]}", "declared new people by "
                       f"budget.disjoint_from_previous ({how})")
    return PROJECT_ACCOUNT


def account_id(conn: sa.Connection, name: str) -> int:
    """The number of account ``name`` in the ledger, created on first use (a ledger of
    earlier versions is migrated first: module docstring). Inside a locked transaction."""
    names = _names(conn)
    if names is None:
        names = _migrate(conn)
    if name not in names:
        names[name] = max([Store.next_account(conn) - 1, *names.values()], default=-1) + 1
    _save(conn, names)
    return names[name]


def _names(conn: sa.Connection) -> dict[str, int] | None:
    row = conn.execute(sa.select(META.c.value).where(META.c.key == _NAMES)).first()
    return None if row is None else {k: int(v) for k, v in json.loads(row[0]).items()}


def _save(conn: sa.Connection, names: dict[str, int]) -> None:
    value = json.dumps(names, sort_keys=True)
    if conn.execute(sa.select(META.c.key).where(META.c.key == _NAMES)).first() is None:
        conn.execute(sa.insert(META).values(key=_NAMES, value=value))
    else:
        conn.execute(sa.update(META).where(META.c.key == _NAMES).values(value=value))


def _migrate(conn: sa.Connection) -> dict[str, int]:
    """Name the accounts of a ledger written before named accounts (module docstring)."""
    from dpfair.data.registry import specs

    releases = Store.release_rows(conn)
    if not releases:
        return {}
    public = set(specs())
    project = Store.next_account(conn)
    names = {PROJECT: project}
    for r in releases:
        if r["source"] in public:
            counted = [x for x in releases if x["source"] == r["source"] and x["status"] != "void"]
            if counted:
                names[f"public:{r['source']}"] = min(counted[-1]["accounts"])
            continue
        accounts = sorted({*r["accounts"], project})
        conn.execute(sa.update(RELEASES).where(RELEASES.c.id == r["id"])
                     .values(accounts=json.dumps(accounts)))
    for version, source, accounts in conn.execute(
            sa.select(VERSIONS.c.version, VERSIONS.c.source, VERSIONS.c.accounts)):
        if source not in public:
            merged = sorted({*json.loads(accounts), project})
            conn.execute(sa.update(VERSIONS).where(VERSIONS.c.version == version)
                         .values(accounts=json.dumps(merged)))
    return names
