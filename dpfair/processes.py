"""Is the process that owns a record still alive? (issue: clean up after crashes)

A run or a temporary file records its owner's host and pid when it starts; a later start on
the same host asks :func:`alive` before it cleans up what a killed (SIGKILL) process left.
A pid is reused once its process is gone, so a process that started after the record was
made is not its owner; a zombie (killed, not yet reaped) is dead.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["alive", "host"]


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
