"""Is the process that owns a record still alive? (issue: clean up after crashes)

A run or a temporary file records its owner's host and pid when it starts; a later start on
the same host asks :func:`alive` before it cleans up what a killed (SIGKILL) process left.
A pid is reused once its process is gone, so a process that started after the record was
made is not its owner; a zombie (killed, not yet reaped) is dead. SIGTERM kills Python
without running ``finally`` blocks or ``atexit``: :func:`sigterm_raises` turns it into
``SystemExit`` so that they run, and sets the process's stop flag (:func:`stop_requested`):
threads that start work (tuning workers) check it and start nothing new. A call of the
tracking store is not cut by it (:func:`uninterrupted`).

Tuning worker processes die with the process that spawned them (:func:`die_with_parent`: the
kernel's parent-death signal on Linux, and :func:`parent_gone` checked before each trial), and
their job folder (``dpfair-tuning-<owner pid>-*``) left by a SIGKILLed owner is removed by the
next start of any command (:func:`remove_stale_job_dirs`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from dpfair.errors import Terminated

__all__ = ["JOB_DIR_PREFIX", "alive", "die_with_parent", "host", "parent_gone",
           "remove_stale_job_dirs", "request_stop", "sigterm_raises", "started_at",
           "stop_requested",
           "uninterrupted"]

#: The temporary folder of a multi-worker tuning job: ``<tmp>/dpfair-tuning-<owner pid>-*``.
JOB_DIR_PREFIX = "dpfair-tuning-"
_STOP = threading.Event()
#: how deep the main thread is in uninterrupted() blocks, and the SIGTERM they hold back
_held = {"depth": 0, "signal": 0}
_PR_SET_PDEATHSIG = 1  # prctl(2)


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
        _STOP.set()
        if _held["depth"]:  # inside uninterrupted(): raised when it ends
            _held["signal"] = signum
            return
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Within the block, the ``Terminated`` a SIGTERM raises (:func:`sigterm_raises`) waits
    until the block ends, and is raised then if the block ended normally (an error of the block
    propagates as it is; the stop flag is set either way). Around a call of the tracking store:
    cut inside its transaction, the call's connection keeps the database locked, and marking
    the run FAILED then waits for the lock and fails, leaving the run RUNNING. Threads other
    than the main one run the block unchanged (signals reach only the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
    if not _held["depth"] and _held["signal"]:
        signum, _held["signal"] = _held["signal"], 0
        raise Terminated(128 + signum)


def request_stop() -> None:
    """Tell this process's threads to stop (as a SIGTERM inside :func:`sigterm_raises` does):
    for a signal that another handler took (Prefect's, inside a flow run)."""
    _STOP.set()


def stop_requested() -> bool:
    """Whether this process was told to stop (SIGTERM inside :func:`sigterm_raises`): start no
    new trial or training."""
    return _STOP.is_set()


def die_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when its parent ``parent`` dies (Linux's
    ``PR_SET_PDEATHSIG``; elsewhere :func:`parent_gone` before each trial is the check), and
    exit at once if the parent is gone already."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if parent_gone(parent):
        raise SystemExit(f"the process {parent} that started this worker is gone")


def parent_gone(parent: int | None) -> bool:
    """Whether a worker started by process ``parent`` lost it (it was re-parented)."""
    return parent is not None and os.getppid() != parent


def remove_stale_job_dirs() -> list[Path]:
    """Remove the job folders (``dpfair-tuning-<pid>-*`` in the temporary directory) whose
    owner process is dead; returns them."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{JOB_DIR_PREFIX}*-*"):
        pid = path.name[len(JOB_DIR_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or not path.is_dir():
            continue
        with contextlib.suppress(OSError):
            if not alive(int(pid), since=path.stat().st_mtime):
                shutil.rmtree(path)
                removed.append(path)
    return removed
