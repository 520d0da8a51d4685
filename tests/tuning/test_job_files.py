"""The temporary job folder of multi-worker tuning (``dpfair-tuning-<pid>-*/job.pkl``) is
removed on every exit of :func:`spawn_workers` (normal, exception, SIGTERM, which also ends
the workers), and one left by a SIGKILLed owner is removed by the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import dpfair.tuning.worker as worker_module

# Stands for the workers: sleeps, after writing its pid to the folder given.
_SLEEPER = ("import os, sys, time; open(os.path.join(sys.argv[1], str(os.getpid())), 'w'); "
            "time.sleep(60)")

# Runs spawn_workers with sleeping workers, the temporary directory being argv[1].
_OWNER = f"""
import subprocess, sys, tempfile
from types import SimpleNamespace
import dpfair.tuning.worker as w
tempfile.tempdir = sys.argv[1]
w.subprocess = SimpleNamespace(Popen=lambda args: subprocess.Popen(
    [sys.executable, "-c", {_SLEEPER!r}, sys.argv[2]]))
w.spawn_workers({{"job": 1}}, 2)
"""


@pytest.fixture
def tmpdir_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def _job_dirs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("dpfair-tuning-*"))


def _fake_popen(script: str, fail_at: int | None = None) -> SimpleNamespace:
    calls: list[int] = []

    def popen(args: list[str]) -> subprocess.Popen[bytes]:
        calls.append(1)
        if len(calls) == fail_at:
            raise OSError("cannot start a worker")
        return subprocess.Popen([sys.executable, "-c", script])

    return SimpleNamespace(Popen=popen)


def test_normal_exit_removes_the_job_folder(tmpdir_, monkeypatch):
    seen: list[list[Path]] = []
    fake = _fake_popen("pass")
    real_popen = fake.Popen
    fake.Popen = lambda args: (seen.append(_job_dirs(tmpdir_)), real_popen(args))[1]
    monkeypatch.setattr(worker_module, "subprocess", fake)
    assert worker_module.spawn_workers({"job": 1}, 2) == [0, 0]
    [[job_dir], _] = seen  # it existed, named by its owner's pid, while the workers ran
    assert job_dir.name.startswith(f"dpfair-tuning-{os.getpid()}-")
    assert _job_dirs(tmpdir_) == []


def test_exception_removes_the_folder_and_ends_started_workers(tmpdir_, monkeypatch):
    procs: list[subprocess.Popen[bytes]] = []
    fake = _fake_popen("import time; time.sleep(60)", fail_at=2)
    real_popen = fake.Popen
    fake.Popen = lambda args: procs.append(real_popen(args)) or procs[-1]
    monkeypatch.setattr(worker_module, "subprocess", fake)
    with pytest.raises(OSError, match="cannot start a worker"):
        worker_module.spawn_workers({"job": 1}, 3)
    assert _job_dirs(tmpdir_) == []
    assert len(procs) == 1 and procs[0].poll() is not None


def _start_owner(tmp: Path, pids: Path) -> subprocess.Popen[bytes]:
    """An owner process running spawn_workers, once its two workers are up."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp), str(pids)])
    deadline = time.monotonic() + 120
    while len(list(pids.iterdir())) < 2:
        assert time.monotonic() < deadline and owner.poll() is None
        time.sleep(0.1)
    [job_dir] = _job_dirs(tmp)
    assert (job_dir / "job.pkl").exists()
    return owner


def _worker_pids(pids: Path) -> list[int]:
    return [int(p.name) for p in pids.iterdir()]


def _gone(pid: int) -> bool:
    from dpfair.processes import alive

    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def test_sigterm_removes_the_folder_and_ends_the_workers(tmp_path, tmpdir_):
    pids = tmp_path / "pids"
    pids.mkdir()
    owner = _start_owner(tmpdir_, pids)
    os.kill(owner.pid, signal.SIGTERM)
    assert owner.wait(timeout=60) == 128 + signal.SIGTERM
    assert _job_dirs(tmpdir_) == []
    assert all(_gone(pid) for pid in _worker_pids(pids))


def test_next_start_removes_the_folder_of_a_killed_owner(tmp_path, tmpdir_):
    pids = tmp_path / "pids"
    pids.mkdir()
    owner = _start_owner(tmpdir_, pids)
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        [left] = _job_dirs(tmpdir_)
        mine = Path(tempfile.mkdtemp(prefix=f"dpfair-tuning-{os.getpid()}-"))  # owner alive
        assert worker_module.remove_stale_job_dirs() == [left]
        assert _job_dirs(tmpdir_) == [mine]
    finally:
        for pid in _worker_pids(pids):  # the SIGKILLed owner could not end its workers
            os.kill(pid, signal.SIGKILL)
