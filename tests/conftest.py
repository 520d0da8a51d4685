"""Shared fixtures for the whole test suite. Keep minimal; area fixtures live in tests/<area>/."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

# OpenMP's idle threads sleep instead of spinning, in this process and every process a test
# starts (before torch loads libgomp): the suite runs two pytest workers and their commands on
# two cores, where spinning threads wait on descheduled peers and burn CPU for nothing (a
# `dpfair train` used 10.6-12.4 s of CPU with spinning, 8.0 s without, same thread count and
# results: benchmarks/results/test_suite.md). A value already set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dpfair  # noqa: E402, F401  tools never phone home from tests (dpfair.NO_TELEMETRY)

REPO_ROOT = Path(__file__).resolve().parents[1]

#: The test files that take longest as a whole (wall time on the idle 2-core machine: each
#: runs servers, DVC or many commands), longest first. `make test` hands files to its workers
#: in collection order (pytest-xdist's ``--dist loadfile --no-loadscope-reorder``), so these
#: start first and no long file starts last while the other worker idles: the longest-first
#: rule of scheduling (benchmarks/results/test_suite.md has the durations).
LONGEST_FIRST = (
    "tests/data/test_dvc.py",
    "tests/release/test_release.py",
    "tests/flows/test_quiet_run.py",
    "tests/training/test_distributed.py",
    "tests/flows/test_experiment_flow.py",
    "tests/flows/test_resume.py",
    "tests/flows/test_schedule.py",
    "tests/flows/test_crash.py",
    "tests/cli/test_train_tune.py",
    "tests/ledger/test_privacy_unit.py",
    "tests/flows/test_dask.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """:data:`LONGEST_FIRST` first, in its order; every other test where it was."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One Prefect server per pytest worker for the flow and release tests: Prefect's test
    harness (a temporary server, this process's settings pointing at it) on a database copied
    from Prefect's empty one (``flows.server.empty_database``, as ``make install`` leaves it):
    its server skips the migrations, as a new home's temporary server of ``dpfair run`` does
    (4-5 s of CPU). The harness makes its database folder with its module's ``mkdtemp``, which
    returns the seeded folder for that one call."""
    from prefect.testing import utilities

    from dpfair.user_cache import copy_sqlite
    from flows.server import empty_database

    folder = tempfile.mkdtemp(prefix="dpfair-prefect-harness-")
    copy_sqlite(empty_database(), Path(folder) / "prefect-test.db")
    make_folder = utilities.mkdtemp
    utilities.mkdtemp = lambda: folder
    try:
        with utilities.prefect_test_harness(server_startup_timeout=120):
            utilities.mkdtemp = make_folder
            yield
    finally:
        utilities.mkdtemp = make_folder


@pytest.fixture(scope="session")
def prefect_api(prefect_harness) -> str:
    """The API URL of the session's Prefect server (:func:`prefect_harness`), for a command
    run in a subprocess (``PREFECT_API_URL``) that is not testing a temporary server."""
    from prefect.settings import get_current_settings

    return str(get_current_settings().api.url)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (where pyproject.toml, params.yaml and dvc.yaml live)."""
    return REPO_ROOT


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as ``python benchmarks/<name>.py`` would run it (its
    folder on ``sys.path``, registered in ``sys.modules`` so its dataclasses resolve)."""
    script = REPO_ROOT / "benchmarks" / f"{name}.py"
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def local_dataset_missing(*datasets: str) -> list[str]:
    """The raw files of ``datasets`` found in neither the mirror nor the download cache."""
    from dpfair.data.sources import cache_dir, mirror_dir, sources_of

    places = [p for p in (mirror_dir(), cache_dir()) if p is not None]
    return [
        f"{rec.dirname}/{rec.filename}"
        for name in datasets
        for rec in sources_of(name)
        if not any((p / rec.dirname / rec.filename).is_file() for p in places)
    ]


def requires_dataset(*datasets: str) -> pytest.MarkDecorator:
    """Skip (with a reason naming the files and how to provide them) unless every raw file of
    ``datasets`` is already on this machine. Tests never download. In CI the data must be
    there: the mark is then a no-op and a missing file fails the test loudly."""
    missing = local_dataset_missing(*datasets)
    reason = (
        f"needs the {', '.join(datasets)} data ({', '.join(missing)} not found): set "
        "DPFAIR_DATA_MIRROR to a folder holding them (layout of ../shared/datasets, md5 in "
        "its SOURCES.md) or run `dpfair data prepare <name>` once to download them"
    )
    return pytest.mark.skipif(bool(missing) and not os.environ.get("CI"), reason=reason)


def epsilon_oracle(*events: object, delta: float) -> float:
    """ε of ``events`` composed, by dp_accounting's own accountants called directly: the smaller
    of RDP and PLD (pessimistic, value_discretization_interval 1e-3; a step's Gaussians on one
    batch written as one, ``accounting.reduced``), both valid upper bounds. It is what
    ``dpfair.accounting.accountant.epsilon`` reports for events without a search, to 1e-4 (PLDs
    composed in another order round differently): compare with ``rel=1e-4``."""
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    from dpfair.accounting.accountant import reduced

    rdp, pld = RdpAccountant(), PLDAccountant(value_discretization_interval=1e-3)
    for event in events:
        rdp.compose(event)
        pld.compose(reduced(event))
    return min(rdp.get_epsilon(delta), pld.get_epsilon(delta))


# ------------------------------------------------------------------ PostgreSQL server


def _pg_bin() -> Path | None:
    cands = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return cands[-1].parent if cands else None


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL server on a loopback port (Debian's postgresql binaries).

    As root, initdb refuses to run: the data directory is given to the ``postgres`` user and
    the server runs through ``runuser -u postgres``.
    """
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
            "(apt-get install postgresql)"
        )
    as_user: list[str] = []
    root = tempfile.mkdtemp(prefix="dpfair-pg-")
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and no 'postgres' user to run the server")
        if runuser is None:
            pytest.skip("running as root and no runuser to drop privileges")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = [runuser, "-u", "postgres", "--"]
    data = os.path.join(root, "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def run(*cmd: str) -> None:
        subprocess.run([*as_user, *cmd], check=True, capture_output=True, timeout=120)

    run(str(bindir / "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
    opts = f"-p {port} -h 127.0.0.1 -k {root} -c fsync=off"
    run(
        str(bindir / "pg_ctl"),
        "-D",
        data,
        "-o",
        opts,
        "-l",
        os.path.join(root, "log"),
        "-w",
        "-t",
        "60",
        "start",
    )
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", data, "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)



def race(script: str, argvs: list[list[str]], goes: list[str]) -> list[list[str]]:
    """Processes of ``script`` (one per argv) raced: each prints ``ready`` once set up, then
    reads its stdin, where each of ``goes`` is written to all of them at once (after every one
    is ready: none busy-waits), and answers it with one line. What each said, per go."""
    procs = [subprocess.Popen([sys.executable, "-c", script, *argv], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    # a racer that hangs is killed after 300 s: its line is then empty, and the test fails
    watchdog = threading.Timer(300, lambda: [proc.kill() for proc in procs])
    watchdog.start()
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                for other in procs:
                    other.kill()
                pytest.fail(f"a racer failed: {proc.communicate(timeout=300)[1][-3000:]}")
        said = []
        for go in goes:
            for proc in procs:
                proc.stdin.write(f"{go}\n")
                proc.stdin.flush()
            said.append([proc.stdout.readline().strip() for proc in procs])
        for proc in procs:
            _, err = proc.communicate(timeout=300)  # stdin closed: the racer ends
            assert proc.returncode == 0, err[-3000:]
    finally:
        watchdog.cancel()
    return said


def cli_in_a_fresh_python(folder: Path, commands: dict[str, list[str]],
                           watched: tuple[str, ...]) -> tuple[dict[str, list], list[str]]:
    """Each of ``commands`` (dpfair's arguments) run in turn in one fresh Python process in
    ``folder``: ``({name: [exit code, output]}, the modules of watched it imported)``."""
    script = textwrap.dedent(f"""
        import json, sys
        from typer.testing import CliRunner
        from dpfair.cli import app
        out = {{}}
        for name, args in {commands!r}.items():
            result = CliRunner().invoke(app, args)
            out[name] = [result.exit_code, result.output]
        print(json.dumps([out, [m for m in {list(watched)!r} if m in sys.modules]]))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=folder, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return out, loaded


#: method settings where every clipping rule bites on the tests' small models and batches (the
#: hand-computed step tests rely on C = 0.3); any other registered method runs at its example
BITING_RULES = {
    "nonprivate": {},
    "dpsgd": {"C": 0.3},
    "dpsgd_normalized": {"name": "dpsgd", "C": 0.3, "normalize": True},
    "dpsgd_f": {"C0": 0.3, "sigma1": 2.0},
    "naive_reweight": {"C0": 0.3, "sigma1": 2.0},
    "dpsgd_global": {"C0": 0.3, "Z": 0.8},
    "adaptive": {"C0": 0.3, "tau": 1.0, "sigma_count": 2.0},
    "adaclip": {"C0": 0.3, "sigma_count": 2.0},
    "dpsgd_global_adapt": {"C0": 0.3, "Z0": 0.8, "sigma2": 2.0},
    "bounded_adaptive": {"C0": 0.3, "C_LB": 0.2, "sigma_count": 2.0},
    "dp_sat": {"C": 0.3, "rho": 0.05},
    "bam": {"C": 0.3, "lam": 0.05},
    "fairlens": {"C": 0.3},
}


def biting_method_config(key: str) -> dict:
    """The method config (a params.yaml ``method:`` mapping) of ``key`` under
    :data:`BITING_RULES`, or its registered example."""
    from dpfair.methods import registered_methods

    if key in BITING_RULES:
        return {"name": key, **BITING_RULES[key]}
    return registered_methods()[key].example().model_dump()

