"""Prefect's temporary server (uvicorn), started by the first flow call without a
``PREFECT_API_URL``, is stopped by Prefect at exit (``atexit``). Two exits skip that:

- SIGTERM, which ends Python without ``atexit``: :func:`dpfair.processes.sigterm_raises`
  turns it into ``SystemExit`` while the flow runs;
- SIGKILL, which nothing survives: :func:`mark_owner` puts this process's pid into the
  environment the server inherits (``DPFAIR_PREFECT_OWNER``), and the next start stops the
  temporary servers whose owner is dead (:func:`stop_orphan_servers`). Only this user's
  processes that run Prefect's server app and carry the mark are considered, so a server
  started any other way (``prefect server start``, another tool) is never touched.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from dpfair.processes import alive, started_at

OWNER_VAR = "DPFAIR_PREFECT_OWNER"
_SERVER_APP = b"prefect.server.api.server:create_app"

__all__ = ["OWNER_VAR", "mark_owner", "marked_owner", "stop_orphan_servers"]


def mark_owner() -> None:
    """Mark the servers this process starts from now on as its own."""
    os.environ[OWNER_VAR] = str(os.getpid())


def stop_orphan_servers() -> list[int]:
    """SIGTERM every marked temporary Prefect server of this user whose owner is dead; returns
    their pids (none where ``/proc`` is absent)."""
    stopped = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        owner = marked_owner(pid)
        if owner is None or alive(owner, since=started_at(pid)):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:  # gone meanwhile
            continue
        stopped.append(pid)
    return stopped


def marked_owner(pid: int) -> int | None:
    """The owner pid marked on process ``pid`` if it is this user's and runs Prefect's server
    app, else None."""
    proc = Path(f"/proc/{pid}")
    try:
        if proc.stat().st_uid != os.getuid() or _SERVER_APP not in (proc / "cmdline").read_bytes():
            return None
        environ = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    mark = OWNER_VAR.encode() + b"="
    value = next((v[len(mark):] for v in environ if v.startswith(mark)), b"")
    return int(value) if value.isdigit() else None
