"""Prefect's temporary API server (uvicorn) for a flow run without a ``PREFECT_API_URL``:
:func:`start_api_server` starts it in the background (the run's work that needs no server goes
on meanwhile), :func:`api_server_ready` waits for it before the flow starts; one server for the
process and its worker processes, stopped at exit (``atexit``). Two exits skip the stop:

- SIGTERM, which ends Python without ``atexit``: :func:`dpfair.processes.sigterm_raises`
  turns it into ``SystemExit`` while the flow runs;
- SIGKILL, which nothing survives: :func:`mark_owner` puts this process's pid into the
  environment the server inherits (``DPFAIR_PREFECT_OWNER``), and the next start stops the
  temporary servers whose owner is dead (:func:`stop_orphan_servers`). Only this user's
  processes that run Prefect's server app and carry the mark are considered, so a server
  started any other way (``prefect server start``, another tool) is never touched.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from dpfair.errors import ConfigError
from dpfair.processes import alive, started_at
from dpfair.user_cache import cache_dir, copy_sqlite, made_once
from dpfair.workspace import exclusive

OWNER_VAR = "DPFAIR_PREFECT_OWNER"
_SERVER_APP = b"prefect.server.api.server:create_app"

__all__ = ["OWNER_VAR", "api_server_ready", "api_url", "empty_database", "mark_owner",
           "marked_owner", "require_api_url", "start_api_server", "stop_orphan_servers"]

_log = logging.getLogger("prefect")  # the logger of the messages of Prefect's own server


def api_url() -> str | None:
    """The Prefect API this process talks to: ``PREFECT_API_URL`` from the environment or the
    active Prefect profile (``prefect config set PREFECT_API_URL=...``), or None. (Prefect's
    settings alone: 1 s, where the flows' modules take 6-7 s to import.)"""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def require_api_url(command: str) -> str:
    """:func:`api_url`, or a ConfigError saying how to start and name a Prefect server."""
    if not (url := api_url()):
        raise ConfigError(
            f"{command} needs a running Prefect server: start one with `prefect server "
            "start`, then `prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api` (or "
            "set PREFECT_API_URL in the environment)"
        )
    return url


def mark_owner() -> None:
    """Mark the servers this process starts from now on as its own."""
    os.environ[OWNER_VAR] = str(os.getpid())


def start_api_server() -> None:
    """Start Prefect's temporary API server now, in a process of its own (this process never
    imports Prefect's server application, 2-3 s), in the background;
    :func:`api_server_ready` waits for it. Nothing is started where a Prefect API is
    configured (``PREFECT_API_URL``: the environment, the active profile), temporary servers
    are turned off (``PREFECT_SERVER_EPHEMERAL_ENABLED``) or this process started one
    already. One server for this process and the worker processes it starts (a local Dask
    cluster's inherit ``PREFECT_API_URL``), stopped at exit as Prefect stops its own, marked
    as this process's (:func:`mark_owner`); orphans of killed runs are stopped first."""
    global _server
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if orphans := stop_orphan_servers():  # whether or not this run starts one
        _log.warning("stopped Prefect temporary server(s) left by a killed run: pids %s",
                     ", ".join(map(str, orphans)))
    if _server is not None or settings.api.url or not settings.server.ephemeral.enabled:
        return  # (with temporary servers turned off, Prefect's client says what to set)
    mark_owner()
    _seed_database(settings.server.database.connection_url)
    _server = _TemporaryServer()
    atexit.register(_server.stop)


def empty_database() -> Path:
    """Prefect's empty database for the installed Prefect (``make install`` makes it, in the
    user's cache): what a temporary server leaves in a new home after its first start (the
    schema migrated, the block types registered), before any flow ran."""
    return made_once(_empty_database_name(), _make_empty_database)


def _empty_database_name() -> str:
    from prefect import __version__

    return f"prefect-schema/prefect-{__version__}.sqlite"


def _make_empty_database(database: Path) -> None:
    home = database.parent / "home"
    env = {k: v for k, v in os.environ.items()  # this process's, telemetry off included
           if not (k.startswith("PREFECT_") and "DATABASE" in k)}
    server = _TemporaryServer({**env, "PREFECT_HOME": str(home)})
    try:
        server.wait()
    finally:
        server.stop()
    copy_sqlite(home / "prefect.db", database)


def _seed_database(url: Any) -> None:
    """A new home's SQLite database (Prefect's default) starts as a copy of
    :func:`empty_database`, where it is made: its server then skips the migrations (4-5 s of
    CPU). Under an exclusive ``flock`` of the file, so runs starting together copy it once."""
    url = url.get_secret_value() if url is not None else ""
    prefix = "sqlite+aiosqlite:///"
    empty = cache_dir() / _empty_database_name()
    if not url.startswith(prefix) or url == prefix + ":memory:" or not empty.is_file():
        return
    path = Path(url[len(prefix):])
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(path) as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            copy_sqlite(empty, path)


def api_server_ready() -> None:
    """Wait until the server of :func:`start_api_server` answers, then point Prefect's
    settings at it (``PREFECT_API_URL``, no UI); nothing to wait for without one."""
    if _server is None:
        return
    url = _server.wait()
    from prefect.context import refresh_global_settings_context
    from prefect.settings import get_current_settings

    os.environ.update({"PREFECT_API_URL": url, "PREFECT_UI_URL": ""})  # workers inherit it
    refresh_global_settings_context()
    if get_current_settings().api.url != url:
        raise RuntimeError(f"Prefect's settings do not take the temporary server {url}: set "
                           "PREFECT_API_URL outside dpfair's process")


class _TemporaryServer:
    """Prefect's temporary API server (the command line and environment its own
    ``SubprocessASGIServer`` uses), started on a free port of 127.0.0.1 without importing
    Prefect's server application into this process."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = dict(os.environ) if env is None else env
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/api"
        spec = importlib.util.find_spec("prefect")
        assert spec is not None and spec.origin is not None
        app_dir = str(Path(spec.origin).parent.parent)
        return subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", app_dir, "--factory",
             _SERVER_APP.decode(), "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"],
            env={**self.env, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                 "PREFECT__SERVER_FINAL": "1"})

    def wait(self) -> str:
        """The API's URL once ``/health`` answers; a server that exits first is an error (its
        port taken meanwhile, exit code 3: started again on another)."""
        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code == 3:
                self.process = self._spawn()
            elif code is not None:
                raise RuntimeError(f"Prefect's temporary server exited with code {code}")
            try:
                with _DIRECT.open(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        _log.info("Started temporary server on %s", self.url)
                        return self.url
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Prefect's temporary server did not answer in {timeout:g} s")

    def stop(self) -> None:
        """Terminate the server (killed when it has not ended in 5 s)."""
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_server: _TemporaryServer | None = None
#: the health check's opener: straight to 127.0.0.1, never through a configured HTTP proxy
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
