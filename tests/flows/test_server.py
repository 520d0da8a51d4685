"""Prefect's temporary server does not outlive a killed `dpfair run` (:mod:`flows.server`):
SIGTERM lets Prefect stop it at exit; after SIGKILL the next start stops it. A server whose
owner lives, or that no dpfair run marked, is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpfair.processes import alive
from flows.server import OWNER_VAR, stop_orphan_servers
from tests.flows.conftest import seed_home

# A stand-in whose command line names Prefect's server app.
_FAKE_SERVER = [sys.executable, "-c", "import time; time.sleep(60)",
                "prefect.server.api.server:create_app"]

# Starts a real temporary server, marked as this process's, and sleeps (argv[1]: how to stop).
_OWNER = """
import sys, time
from dpfair.processes import sigterm_raises
from flows.server import mark_owner
mark_owner()
from prefect.server.api.server import SubprocessASGIServer
with sigterm_raises():
    server = SubprocessASGIServer()
    server.start(timeout=120)
    print(server.server_process.pid, flush=True)
    time.sleep(600)
"""


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _gone(pid: int, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def test_only_marked_servers_of_dead_owners_are_stopped():
    env = dict(os.environ)
    env.pop(OWNER_VAR, None)
    orphan = subprocess.Popen(_FAKE_SERVER, env={**env, OWNER_VAR: str(_dead_pid())})
    owned = subprocess.Popen(_FAKE_SERVER, env={**env, OWNER_VAR: str(os.getpid())})
    unmarked = subprocess.Popen(_FAKE_SERVER, env=env)
    marked_other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                    env={**env, OWNER_VAR: str(_dead_pid())})
    try:
        time.sleep(0.5)  # let them exec
        stopped = stop_orphan_servers()  # a real orphan another test left counts too
        assert orphan.pid in stopped
        assert not {owned.pid, unmarked.pid, marked_other.pid} & set(stopped)
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert all(p.poll() is None for p in (owned, unmarked, marked_other))
    finally:
        for proc in (orphan, owned, unmarked, marked_other):
            proc.kill()
            proc.wait()


def _start_owner() -> tuple[subprocess.Popen[str], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    seed_home(Path(env["PREFECT_HOME"]))  # the servers' database: no migrations
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE,
                             text=True, env=env)
    line = owner.stdout.readline().strip()
    assert line.isdigit(), f"the temporary server did not start (exit {owner.poll()})"
    return owner, int(line)


@pytest.mark.slow
def test_sigkilled_owner_server_is_stopped_by_the_next_start():
    owner, server = _start_owner()
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert alive(server)  # the orphan
        assert server in stop_orphan_servers()
        assert _gone(server)
    finally:
        if alive(server):
            os.kill(server, signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_stops_the_server_at_exit():
    owner, server = _start_owner()
    try:
        os.kill(owner.pid, signal.SIGTERM)
        assert owner.wait(timeout=30) == 128 + signal.SIGTERM
        assert _gone(server)
    finally:
        if alive(server):
            os.kill(server, signal.SIGKILL)
