"""The temporary job folder of multi-worker tuning (``dpfair-tuning-<pid>-*/job.pkl``) is
removed on every exit of :func:`spawn_workers` (normal, exception, SIGTERM, which also ends
the workers), and one left by a SIGKILLed owner is removed by the next start."""

from __future__ import annotations

import contextlib
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


# A real two-worker search (journal storage, trials of 1 s) run by an owner process.
_SEARCH_OWNER = """
import sys, tempfile
from pathlib import Path
tempfile.tempdir = sys.argv[2]
from dpfair import tuning
from tests.tuning.conftest import BASE, METHOD, TRAIN, cfg, fast_event, make_dataset
c = cfg(Path(sys.argv[1]), mode="fixed", n_runs=40, workers=2, study_name="k",
        storage=f"journal:{sys.argv[1]}/journal.log", heartbeat_interval=5)
tuning.tune(METHOD, {**BASE, "sleep": 1.0}, make_dataset(), c, TRAIN, event_fn=fast_event)
"""


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_workers_die_with_a_killed_owner_and_the_next_command_removes_its_folder(tmp_path,
                                                                                 tmpdir_):
    """SIGKILL of the process running a search: its workers used to go on starting trials
    (one 11 s after the kill) and the folder with the pickled dataset stayed. Now the workers
    get the parent-death signal, no trial starts after the kill, and any dpfair command's
    start removes the folder."""
    import optuna
    from optuna.storages.journal import JournalFileBackend
    from typer.testing import CliRunner

    from dpfair.cli.commands import app
    from tests.tuning.conftest import worker_env

    marker = tmp_path / "started"
    env = {**worker_env(), "DPFAIR_TEST_SLOW": "1", "DPFAIR_TEST_MARKER": str(marker)}
    owner = subprocess.Popen([sys.executable, "-c", _SEARCH_OWNER, str(tmp_path), str(tmpdir_)],
                             env=env)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() or len(_children(owner.pid)) < 2:
            assert owner.poll() is None and time.monotonic() < deadline, "no worker started"
            time.sleep(0.1)
        workers = _children(owner.pid)
        os.kill(owner.pid, signal.SIGKILL)
        killed_at = time.time()
        owner.wait()
        assert all(_gone(pid) for pid in workers)
    finally:
        for pid in [*workers, *_children(owner.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    time.sleep(2)  # a surviving worker would start its next trial within a second
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / "journal.log")))
    trials = optuna.load_study(study_name="k", storage=storage).get_trials(deepcopy=False)
    late = [t.number for t in trials
            if t.datetime_start is not None and t.datetime_start.timestamp() > killed_at + 0.5]
    assert late == [] and len(trials) < 40
    [left] = _job_dirs(tmpdir_)
    assert (left / "job.pkl").exists()
    assert CliRunner().invoke(app, ["data", "list"]).exit_code == 0
    assert _job_dirs(tmpdir_) == []


# run_worker in a thread (as a pipeline run's tuning task), SIGTERM handled in the main thread.
_THREAD_OWNER = """
import sys, threading, time
from pathlib import Path
from dpfair import tuning
from dpfair.errors import Terminated
from dpfair.processes import sigterm_raises
from dpfair.tuning.worker import run_worker
from tests.tuning.conftest import BASE, METHOD, TRAIN, cfg, fast_event, make_dataset
c = cfg(Path(sys.argv[1]), mode="fixed", n_runs=20, study_name="s")
job = tuning.prepare(METHOD, {**BASE, "sleep": 1.0}, make_dataset(), c, TRAIN,
                     event_fn=fast_event)
thread = threading.Thread(target=run_worker, args=(job,))
try:
    with sigterm_raises():
        thread.start()
        while thread.is_alive():
            time.sleep(0.05)
except Terminated:
    thread.join()
    print("trials", len(tuning.study.load_study(job).get_trials(deepcopy=False)))
"""


def test_after_sigterm_no_new_trial_starts(tmp_path):
    """SIGTERM drained the whole search (a thread kept claiming trials); now the trial in
    flight finishes and no other starts."""
    from tests.tuning.conftest import worker_env

    marker = tmp_path / "started"
    env = {**worker_env(), "DPFAIR_TEST_SLOW": "1", "DPFAIR_TEST_MARKER": str(marker)}
    proc = subprocess.Popen([sys.executable, "-c", _THREAD_OWNER, str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no trial started"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.split() == ["trials", "1"], out
