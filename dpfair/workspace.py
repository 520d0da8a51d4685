"""Where a project's durable state lives, whatever folder a command runs in.

``dvc exp run --temp`` and ``dvc exp run --queue`` run a stage in a copy of the repository
under ``<repo>/.dvc/tmp/exps/`` that DVC deletes afterwards. State that must outlive a run
(the privacy ledger, MLflow's SQLite store and artifacts, Optuna's default storage) is
therefore resolved against :func:`project_root`: the repository the copy was made from, not
the copy. Outputs that DVC itself collects (``outputs/``, ``evaluation/``) stay in the copy.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

try:
    import fcntl
except ImportError:  # Windows has none: there only the retry (for servers) applies
    fcntl = None  # type: ignore[assignment]

__all__ = ["durable_path", "durable_sqlite_uri", "exclusive", "open_racing",
           "project_root"]

T = TypeVar("T")
_DVC_WORKSPACES = (".dvc", "tmp", "exps")


def project_root(start: str | Path | None = None) -> Path:
    """The project that owns ``start`` (default: the working directory): ``start`` itself, or,
    inside a DVC temporary or queued experiment workspace, the repository it was copied from."""
    path = Path(start if start is not None else os.getcwd()).resolve()
    parts = path.parts
    for i in range(len(parts) - len(_DVC_WORKSPACES) + 1):
        if parts[i:i + len(_DVC_WORKSPACES)] == _DVC_WORKSPACES:
            return Path(*parts[:i])
    return path


def durable_path(path: str | Path, root: str | Path | None = None) -> Path:
    """``path`` made absolute against :func:`project_root` of ``root`` when it is relative."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else project_root(root) / path


def durable_sqlite_uri(uri: str, root: str | Path | None = None) -> str:
    """A ``sqlite:///relative.db`` URI made absolute against :func:`project_root`; any other
    URI (an absolute SQLite file, a server, ``file:``) unchanged."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri.startswith(prefix + "/") or uri == prefix + ":memory:":
        return uri
    return prefix + str(durable_path(uri[len(prefix):], root))


def open_racing(open_store: Callable[[], T], url: str, attempts: int = 6,
                seed: Callable[[str], None] | None = None) -> T:
    """``open_store()``: the first open of the MLflow store or Optuna storage at ``url``,
    whose schema the first use of a fresh database creates. Processes started together (several
    ``dpfair tune`` on one database) race on that creation, with varied errors (a duplicate
    table, type or ``alembic_version`` row, a missing index, a schema "out of date" while
    another process is still migrating it). A SQLite file is therefore opened under an
    exclusive ``flock`` of it (which SQLite's own locks ignore): one dpfair process creates the
    schema, the others find it made. A failed open is tried again after a growing pause, up to
    ``attempts`` times, for a database server and for a SQLite file alike: a process that is
    not dpfair (``mlflow ui``, a notebook) takes no ``flock``, and the loser then opens the
    schema the winner made (the preflight has checked that a server answers and logs in).
    ``seed(path)``, for a SQLite file: fills the file with a ready empty database when it is
    new (empty), under the lock, before ``open_store`` (MLflow's:
    :mod:`dpfair.tracking.empty_store`)."""
    path = url.split(":///", 1)[1] if url.startswith("sqlite:///") else None
    locked = bool(path) and path != ":memory:" and fcntl is not None
    attempt = 0
    while True:
        attempt += 1
        try:
            return _under_flock(open_store, path, seed) if locked and path else open_store()
        except Exception:
            if attempt >= attempts:
                raise
            time.sleep(0.5 * attempt + random.random())  # jitter (no secret)


def _under_flock(open_store: Callable[[], T], path: str,
                 seed: Callable[[str], None] | None) -> T:
    """``open_store()`` under an exclusive ``flock`` of the SQLite file ``path``, after
    ``seed(path)`` where the file is new."""
    with exclusive(path) as handle:  # creates an empty file: SQLite takes it as new
        if seed is not None and os.fstat(handle.fileno()).st_size == 0:
            seed(path)
        return open_store()


@contextmanager
def exclusive(path: str | Path) -> Iterator[BinaryIO]:
    """An exclusive ``flock`` of ``path`` (created empty if missing; opened for appending),
    held by this block: other processes and threads taking it wait. Without ``fcntl``
    (Windows) the block runs unlocked."""
    with open(path, "ab") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield handle
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)
