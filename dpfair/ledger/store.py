"""The privacy ledger's durable store: one SQL database for every data source and machine.

By default a SQLite file at an absolute project path (``budget.ledger``, relative paths
resolved by :func:`dpfair.workspace.durable_path`, so ``dvc exp run --temp`` and queued
experiments write into the project's ledger, never into their temporary copy). A team points
``budget.ledger`` at a database server with an SQLAlchemy URL, e.g.
``postgresql+psycopg2://user@host/dpfair``: every machine, CI included, then shares one
lifetime budget.

Writes that must check and record together (a reservation) run in one transaction that holds
the database's write lock: ``BEGIN IMMEDIATE`` on SQLite, a ``SELECT ... FOR UPDATE`` of the
lock row elsewhere. Two processes can therefore never both pass a budget check that only one
of them fits.

The store also keeps the project secret (:func:`Store.secret`): 32 bytes from OS entropy,
created on first use, that keys the fingerprints of people and the published data-version
ids (:mod:`dpfair.ledger.people`). It is never logged or published; whoever can read the
ledger can read it, so the ledger is private working state.

A JSON ledger of earlier versions (``.dpfair/privacy_ledger.json``) is imported on first use
(:func:`import_json_ledger`): its releases keep their ids, status and events.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dpfair.errors import PrivacyError
from dpfair.urls import mask_text, mask_url
from dpfair.workspace import durable_path

__all__ = ["DEFAULT_LEDGER", "Store", "ledger_url"]

DEFAULT_LEDGER = ".dpfair/ledger.sqlite"
#: PostgreSQL advisory lock key taken while the tables are created (any fixed 64-bit number).
_SCHEMA_LOCK = 0x6470_6661_6972
_LEGACY_JSON = ".dpfair/privacy_ledger.json"

_meta = sa.MetaData()
META = sa.Table("dpfair_meta", _meta,
                sa.Column("key", sa.String(64), primary_key=True),
                sa.Column("value", sa.Text, nullable=False))
RELEASES = sa.Table("dpfair_releases", _meta,
                    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
                    sa.Column("id", sa.String(64), unique=True, nullable=False),
                    sa.Column("source", sa.String(255), nullable=False, index=True),
                    sa.Column("version", sa.String(64), nullable=False),
                    sa.Column("accounts", sa.Text, nullable=False),
                    sa.Column("status", sa.String(16), nullable=False),
                    sa.Column("event", sa.Text, nullable=False),
                    sa.Column("epsilon", sa.Float, nullable=False),
                    sa.Column("delta", sa.Float, nullable=False),
                    sa.Column("without_guarantee", sa.Text, nullable=False),
                    sa.Column("declared_disjoint", sa.Boolean, nullable=False),
                    sa.Column("recorded_at", sa.String(40), nullable=False),
                    sa.Column("context", sa.Text, nullable=False))
VERSIONS = sa.Table("dpfair_versions", _meta,
                    sa.Column("version", sa.String(64), primary_key=True),
                    sa.Column("source", sa.String(255), nullable=False),
                    sa.Column("accounts", sa.Text, nullable=False),
                    sa.Column("rows", sa.Integer, nullable=False),
                    sa.Column("declared_disjoint", sa.Boolean, nullable=False))
CLAIMS = sa.Table("dpfair_claims", _meta,
                  sa.Column("key", sa.String(255), primary_key=True),
                  sa.Column("host", sa.String(255), nullable=False),
                  sa.Column("pid", sa.Integer, nullable=False),
                  sa.Column("since", sa.Float, nullable=False))
#: a reservation that must be made once (a search's identity, hashed): the release holding it
KEYS = sa.Table("dpfair_release_keys", _meta,
                sa.Column("key", sa.String(64), primary_key=True),
                sa.Column("release", sa.String(64), nullable=False))
FINGERPRINTS = sa.Table("dpfair_fingerprints", _meta,
                        sa.Column("version", sa.String(64), nullable=False, index=True),
                        sa.Column("kind", sa.String(8), nullable=False),
                        sa.Column("fp", sa.String(40), nullable=False, index=True))


def ledger_url(location: str, root: str | Path | None = None) -> str:
    """The SQLAlchemy URL of ``budget.ledger``: a URL as given, a path (relative to the
    project root, :func:`dpfair.workspace.durable_path`) as a SQLite file."""
    if "://" in location:
        return location
    return f"sqlite:///{durable_path(location, root)}"


class Store:
    """The ledger database at ``url`` (tables created on first use)."""

    #: seconds a claim (:meth:`claim`) lives without renewal
    lease: float = 120.0

    def __init__(self, url: str, lease: float | None = None) -> None:
        self.url = url
        self.display = mask_url(url)
        if lease is not None:
            self.lease = lease
        self._renewing: dict[str, Any] = {}  # claim key -> the Event that stops its renewal
        if url.startswith("sqlite:///"):
            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            self.engine = sa.create_engine(url, connect_args={"timeout": 120})
            sa.event.listen(self.engine, "connect", _sqlite_autocommit_off)
            sa.event.listen(self.engine, "begin", _sqlite_begin_immediate)
        else:
            self.engine = sa.create_engine(url, pool_pre_ping=True)
        try:
            self._create_schema()
        except sa.exc.SQLAlchemyError as exc:
            raise PrivacyError(
                f"the privacy ledger {self.display} cannot be opened ({type(exc).__name__}: "
                f"{mask_text(str(exc.orig) if hasattr(exc, 'orig') else str(exc))[:300]}): "
                "it records what was already spent, so nothing may train until it is "
                "reachable; check budget.ledger") from None

    def _create_schema(self) -> None:
        """The tables and the lock row, created once even when several machines open a new
        ledger at the same moment: in one transaction that SQLite's ``BEGIN IMMEDIATE``
        serialises, and on PostgreSQL (whose DDL is transactional) under a transaction-scoped
        advisory lock. Without it two processes both find no table, and the second
        ``CREATE TABLE`` fails ("already exists")."""
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            _meta.create_all(conn)
            if conn.execute(sa.select(META.c.value).where(META.c.key == "lock")).first() is None:
                conn.execute(sa.insert(META).values(key="lock", value="1"))

    @contextmanager
    def locked(self) -> Iterator[sa.Connection]:
        """A transaction holding the ledger's write lock (module docstring)."""
        with self.engine.begin() as conn:
            if self.engine.dialect.name != "sqlite":
                conn.execute(sa.select(META.c.value).where(META.c.key == "lock")
                             .with_for_update())
            yield conn

    @contextmanager
    def reading(self) -> Iterator[sa.Connection]:
        with self.engine.connect() as conn:
            yield conn

    def secret(self) -> bytes:
        """The project secret (module docstring), created on first use."""
        with self.reading() as conn:
            row = conn.execute(sa.select(META.c.value).where(META.c.key == "secret")).first()
        if row is not None:
            return bytes.fromhex(row[0])
        with self.locked() as conn:
            row = conn.execute(sa.select(META.c.value).where(META.c.key == "secret")).first()
            if row is None:
                conn.execute(sa.insert(META).values(key="secret",
                                                    value=secrets.token_bytes(32).hex()))
                row = conn.execute(sa.select(META.c.value).where(META.c.key == "secret")).first()
        return bytes.fromhex(row[0])

    # ----------------------------------------------------------------------------- rows

    @staticmethod
    def release_rows(conn: sa.Connection, source: str | None = None) -> list[dict[str, Any]]:
        query = sa.select(RELEASES).order_by(RELEASES.c.seq)
        if source is not None:
            query = query.where(RELEASES.c.source == source)
        return [_decode(dict(r._mapping)) for r in conn.execute(query)]

    @staticmethod
    def version_row(conn: sa.Connection, version: str) -> dict[str, Any] | None:
        row = conn.execute(sa.select(VERSIONS).where(VERSIONS.c.version == version)).first()
        return None if row is None else {**row._mapping,
                                         "accounts": json.loads(row._mapping["accounts"])}

    @staticmethod
    def add_version(conn: sa.Connection, version: str, source: str, accounts: Iterable[int],
                    fingerprints: dict[str, list[str]], disjoint: bool) -> None:
        rows = len(fingerprints.get("row", ()))
        conn.execute(sa.insert(VERSIONS).values(
            version=version, source=source, accounts=json.dumps(sorted(set(accounts))),
            rows=rows, declared_disjoint=disjoint))
        batch = [{"version": version, "kind": kind, "fp": fp}
                 for kind, fps in fingerprints.items() for fp in sorted(set(fps))]
        if batch:
            conn.execute(sa.insert(FINGERPRINTS), batch)

    @staticmethod
    def overlapping(conn: sa.Connection, fingerprints: dict[str, list[str]]
                    ) -> dict[str, int]:
        """Recorded versions sharing a fingerprint of the same kind with ``fingerprints``:
        version -> number of shared fingerprints."""
        found: dict[str, int] = {}
        for kind, fps in fingerprints.items():
            unique = sorted(set(fps))
            for start in range(0, len(unique), 500):
                chunk = unique[start:start + 500]
                query = (sa.select(FINGERPRINTS.c.version, sa.func.count())
                         .where(FINGERPRINTS.c.kind == kind, FINGERPRINTS.c.fp.in_(chunk))
                         .group_by(FINGERPRINTS.c.version))
                for version, count in conn.execute(query):
                    found[version] = found.get(version, 0) + int(count)
        return found

    @staticmethod
    def next_account(conn: sa.Connection) -> int:
        used = [a for (accounts,) in conn.execute(sa.select(VERSIONS.c.accounts))
                for a in json.loads(accounts)]
        used += [a for (accounts,) in conn.execute(sa.select(RELEASES.c.accounts))
                 for a in json.loads(accounts)]
        return max(used, default=-1) + 1

    @staticmethod
    def insert_release(conn: sa.Connection, row: dict[str, Any]) -> None:
        conn.execute(sa.insert(RELEASES).values(**_encode(row)))

    @staticmethod
    def keyed_release(conn: sa.Connection, key: str) -> dict[str, Any] | None:
        """The release that holds the reservation key ``key`` (:data:`KEYS`), or None."""
        row = conn.execute(sa.select(RELEASES).join(KEYS, KEYS.c.release == RELEASES.c.id)
                           .where(KEYS.c.key == _key_hash(key))).first()
        return None if row is None else _decode(dict(row._mapping))

    @staticmethod
    def hold_key(conn: sa.Connection, key: str, release_id: str) -> None:
        """Give ``key`` to ``release_id``: an INSERT that the key's uniqueness makes fail
        (``IntegrityError``) when another release holds it; a void holder's key is freed."""
        holder = Store.keyed_release(conn, key)
        if holder is not None and holder["status"] == "void":
            conn.execute(sa.delete(KEYS).where(KEYS.c.key == _key_hash(key)))
        conn.execute(sa.insert(KEYS).values(key=_key_hash(key), release=release_id))

    @staticmethod
    def update_release(conn: sa.Connection, release_id: str, status: str,
                       context: dict[str, str]) -> None:
        conn.execute(sa.update(RELEASES).where(RELEASES.c.id == release_id).values(
            status=status, context=json.dumps(context, sort_keys=True)))

    def claim(self, key: str) -> None:
        """Claim ``key`` for this process in one locked transaction (e.g. the resumption of a
        crashed pipeline run); a ``PrivacyError`` names the live process that holds it.

        A claim is a lease: while it is held a daemon thread renews its time (``since``) every
        quarter of :attr:`lease` seconds. A claim is taken over when its process on this host
        is gone, or when it was not renewed for :attr:`lease` seconds (its machine died or
        lost the database), so a dead machine's claim expires instead of blocking forever."""
        import os
        import time

        from dpfair.processes import alive, host

        with self.locked() as conn:
            row = conn.execute(sa.select(CLAIMS).where(CLAIMS.c.key == key)).first()
            if row is not None:
                held = row._mapping
                mine = held["host"] == host() and held["pid"] == os.getpid()
                dead = held["host"] == host() and not alive(held["pid"], held["since"])
                expired = time.time() - held["since"] > self.lease
                if not (mine or dead or expired):
                    raise PrivacyError(
                        f"{key} is claimed by process {held['pid']} on {held['host']}: another "
                        "dpfair command is resuming it. Wait for it to end (or stop it), then "
                        f"run again (a claim nobody renews expires after {self.lease:g} s); two "
                        "resumptions would release the same trainings twice")
                conn.execute(sa.delete(CLAIMS).where(CLAIMS.c.key == key))
            conn.execute(sa.insert(CLAIMS).values(key=key, host=host(), pid=os.getpid(),
                                                  since=time.time()))
        self._renew(key)

    def _renew(self, key: str) -> None:
        """Renew this process's claim of ``key`` until :meth:`unclaim` (a daemon thread)."""
        import os
        import threading
        import time

        from dpfair.processes import host

        stop = self._renewing.setdefault(key, threading.Event())
        stop.clear()
        me = (host(), os.getpid())

        def beat() -> None:
            while not stop.wait(self.lease / 4):
                try:
                    with self.locked() as conn:
                        conn.execute(sa.update(CLAIMS).where(
                            CLAIMS.c.key == key, CLAIMS.c.host == me[0],
                            CLAIMS.c.pid == me[1]).values(since=time.time()))
                except sa.exc.SQLAlchemyError:
                    continue  # the database is away: the lease runs out unless it returns

        threading.Thread(target=beat, name=f"dpfair-claim-{key[:40]}", daemon=True).start()

    def unclaim(self, key: str) -> None:
        """Give back this process's claim of ``key`` (its renewal stops)."""
        import os

        from dpfair.processes import host

        if (stop := self._renewing.pop(key, None)) is not None:
            stop.set()
        with self.locked() as conn:
            conn.execute(sa.delete(CLAIMS).where(CLAIMS.c.key == key, CLAIMS.c.pid == os.getpid(),
                                                 CLAIMS.c.host == host()))

    def is_empty(self) -> bool:
        with self.reading() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(RELEASES)).scalar() == 0


def _key_hash(key: str) -> str:
    """A reservation key as stored: its SHA-256 (a search's identity can be long)."""
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "accounts": json.dumps(sorted(row["accounts"])),
            "without_guarantee": json.dumps(list(row["without_guarantee"])),
            "context": json.dumps(row["context"], sort_keys=True)}


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    row.pop("seq", None)
    return {**row, "accounts": tuple(json.loads(row["accounts"])),
            "without_guarantee": tuple(json.loads(row["without_guarantee"])),
            "context": json.loads(row["context"])}


def _sqlite_autocommit_off(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)


def _sqlite_begin_immediate(conn: sa.Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def legacy_json(root: str | Path | None) -> Path:
    """Where earlier versions kept the ledger (imported by :func:`import_json_ledger`)."""
    return durable_path(_LEGACY_JSON, root)


def import_json_ledger(store: Store, path: Path) -> int:
    """Import the releases of an earlier JSON ledger at ``path`` into an empty ``store`` (its
    per-source accounts become accounts of their own); returns how many. The JSON file is kept
    and renamed ``*.imported`` so that it is never imported twice."""
    if not path.is_file() or not store.is_empty():
        return 0
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        old = data["releases"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PrivacyError(f"the earlier privacy ledger {path} cannot be read ({exc}): repair "
                           "it from a backup before anything trains") from None
    numbers: dict[tuple[str, int], int] = {}
    with store.locked() as conn:
        for r in old:
            account = numbers.setdefault((r["source"], int(r["account"])), len(numbers))
            if Store.version_row(conn, r["version"]) is None:
                Store.add_version(conn, r["version"], r["source"], [account], {},
                                  bool(r.get("declared_disjoint", False)))
            Store.insert_release(conn, {
                "id": r["id"], "source": r["source"], "version": r["version"],
                "accounts": [account], "status": r["status"],
                "event": json.dumps(r["event"]), "epsilon": float(r["epsilon"]),
                "delta": float(r["delta"]), "without_guarantee": r.get("without_guarantee", []),
                "declared_disjoint": bool(r.get("declared_disjoint", False)),
                "recorded_at": r.get("recorded_at", ""),
                "context": {**r.get("context", {}), "imported_from": str(path)}})
    path.rename(path.with_name(path.name + ".imported"))
    return len(old)
