"""Prefect's temporary server (uvicorn), started by the first flow call without a
``PREFECT_API_URL``, is stopped by Prefect at exit (``atexit``); a flow whose tasks run in
worker processes shares it with them (:func:`one_api_server`). Two exits skip the stop:

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dpfair.processes import alive, started_at

OWNER_VAR = "DPFAIR_PREFECT_OWNER"
_SERVER_APP = b"prefect.server.api.server:create_app"

__all__ = ["OWNER_VAR", "mark_owner", "marked_owner", "one_api_server", "stop_orphan_servers"]


def mark_owner() -> None:
    """Mark the servers this process starts from now on as its own."""
    os.environ[OWNER_VAR] = str(os.getpid())


@contextmanager
def one_api_server(workers_are_processes: bool) -> Iterator[None]:
    """Without a configured Prefect API, a flow whose tasks run in other processes (a local
    Dask cluster) would have every worker process start a temporary server of its own: start
    the flow's one temporary server first and put its URL in the environment the workers
    inherit (``PREFECT_API_URL``, for the block's duration). Prefect stops the server at exit;
    the flow's own client reuses it (one temporary server per process)."""
    from prefect.settings import get_current_settings

    if not workers_are_processes or get_current_settings().api.url or "PREFECT_API_URL" in (
            os.environ):
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start(timeout=int(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                                            "120")))
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        yield
    finally:
        os.environ.pop("PREFECT_API_URL", None)


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
