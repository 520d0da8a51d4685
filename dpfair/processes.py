"""Is the process that owns a record still alive? (issue: clean up after crashes)

A run or a temporary file records its owner's host and pid when it starts; a later start on
the same host asks :func:`alive` before it cleans up what a killed (SIGKILL) process left.
A pid is reused once its process is gone, so a process that started after the record was
made is not its owner; a zombie (killed, not yet reaped) is dead. SIGTERM kills Python
without running ``finally`` blocks or ``atexit``: :func:`sigterm_raises` turns it into
``SystemExit`` so that they run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from dpfair.errors import Terminated

__all__ = ["alive", "host", "sigterm_raises", "started_at"]


def host() -> str:
    return socket.gethostname()


def alive(pid: int, since: float | None = None) -> bool:
    """Whether process ``pid`` on this host lives and (if ``since``, a Unix time, is given)
    started no later than ``since``. Where ``/proc`` is absent only existence is checked."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, start = stat
    if state == "Z":
        return False
    return since is None or start is None or start <= since + 1.0


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (Unix time), or None if unknown or gone."""
    stat = _proc_stat(pid)
    return stat[1] if stat is not None else None


def _proc_stat(pid: int) -> tuple[str, float | None] | None:
    """``(state, start time as Unix time)`` from ``/proc/PID/stat``, or None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    state, ticks = fields[0], int(fields[19])  # fields 3 and 22 of proc(5)
    boot = _boot_time()
    if boot is None:
        return state, None
    return state, boot + ticks / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float | None:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return None


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` (so ``finally`` and ``atexit``
    clean-up runs) where it would otherwise end the process outright: in the main thread,
    with no handler set. Elsewhere the block runs unchanged."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def _exit(signum: int, frame: FrameType | None) -> None:
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
