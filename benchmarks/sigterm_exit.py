"""SIGTERM of `dpfair run` during the final trainings: how long after the signal the trainings
in progress end (their MLflow runs' end time) and the process exits. Three seeds of dpsgd and
of the non-private reference (2,000 epochs each: none could end on its own meanwhile), two
at a time; the signal comes once one trains. Two entries, alternated: the ``dpfair`` command
(its process freezes its objects before it exits, ``dpfair.cli.console.freeze_if_ending``) and
``run_experiment`` called from Python (no freeze: the interpreter's last garbage collection
scans everything).

    .venv/bin/python benchmarks/sigterm_exit.py --repeats 2

Writes benchmarks/results/sigterm_exit.md (``--out`` to change).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model, load_average

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.flows.conftest import SMALL_EXPERIMENT, final_runs, make_workspace  # noqa: E402

ENTRIES = {
    "dpfair run": lambda params: [sys.executable, "-m", "dpfair.cli", "run", "--params", params],
    "run_experiment": lambda params: [
        sys.executable, "-c", "import sys; from flows.experiment import run_experiment; "
        "run_experiment(sys.argv[1], '.')", params],
}


def _finals_ended_ms(db: Path) -> float:
    with sqlite3.connect(db) as con:
        return con.execute(
            "select max(r.end_time) from runs r join tags s on r.run_uuid = s.run_uuid "
            "where s.key = 'dpfair.stage' and s.value = 'final'").fetchone()[0] or 0.0


def once(entry: str, root: Path) -> tuple[float, float, int]:
    """(s from the signal to the last final run's end, s to the exit, exit code)."""
    slow = {**SMALL_EXPERIMENT, "seeds": [0, 1, 2], "methods": {"dpsgd": {"C": 1.0}},
            "train": {**SMALL_EXPERIMENT["train"], "epochs": 2000}}
    params = make_workspace(root, ROOT, slow)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(root / "prefect-home")
    proc = subprocess.Popen(ENTRIES[entry](str(params)), cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not any(status == "RUNNING" for _, status in final_runs(root / "mlflow.db")):
        if proc.poll() is not None:
            raise RuntimeError(f"{entry} ended before a training started ({proc.returncode})")
        time.sleep(0.1)
    signalled = time.time()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=600)
    exited = time.time() - signalled
    return _finals_ended_ms(root / "mlflow.db") / 1000 - signalled, exited, code


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/sigterm_exit.md")
    args = parser.parse_args()
    rows = []
    for i in range(args.repeats):
        for entry in ENTRIES:
            with tempfile.TemporaryDirectory() as tmp:
                ended, exited, code = once(entry, Path(tmp))
            rows.append(f"| {i + 1} | {entry} | {ended:.1f} | {exited:.1f} | {code} |")
            print(rows[-1], flush=True)
    args.out.write_text(
        f"# SIGTERM of `dpfair run` during the finals\n\n"
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {cpu_model()}, {os.cpu_count()} cores, "
        f"load average at the end {load_average()}.\n\n"
        "Seconds after the signal. Trainings ended: the last final run's MLflow end time (its "
        "training stopped at a step, the run marked FAILED). Exit: the process's.\n\n"
        "| repeat | entry | trainings ended (s) | exit (s) | exit code |\n|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
