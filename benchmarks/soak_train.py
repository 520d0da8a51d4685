"""Soak: 20 `dpfair train` runs in one Python process, on an own census CSV with a local
MLflow store and privacy ledger. After each run (the garbage collected first) it records the
process's resident memory, its open file descriptors, its threads, and the entries dpfair
left in the temporary folder (one of this process alone) and in the project folder beyond
the store, the artifacts and the ledger. A leak shows as growth from run to run: the table
gives each figure per run and the ratio of the last run's to the second's (the first
includes the imports and the caches).

    .venv/bin/python benchmarks/soak_train.py            # 20 runs, a few minutes

Writes benchmarks/results/soak_train.md (``--out`` to change, ``--runs`` for another count).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from machine import cpu_model, load_average

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from typer.testing import CliRunner  # noqa: E402

from dpfair.cli.commands import app  # noqa: E402
from tests.cli.conftest import CENSUS_TUNE_PARAMS as BASE  # noqa: E402
from tests.data.own_tables import census_frame  # noqa: E402

#: what a run is expected to write into the project folder (anything else is a leftover)
EXPECTED = {"census.csv", "params.yaml", "mlflow.db", "art", "mlartifacts", ".dpfair"}


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _sample(project: Path, tmp_before: set[str]) -> dict[str, float]:
    gc.collect()
    tmp_now = set(os.listdir(tempfile.gettempdir()))
    return {"rss_mib": _rss_mib(), "fds": len(os.listdir("/proc/self/fd")),
            "threads": threading.active_count(),
            "tmp_entries": len(tmp_now - tmp_before),
            "leftovers": len(set(os.listdir(project)) - EXPECTED)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "results" / "soak_train.md")
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="dpfair-soak-"))
    census_frame(600).to_csv(project / "census.csv", index=False)
    params = copy.deepcopy(BASE)
    params["experiment"]["train"]["epochs"] = 2
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    os.chdir(project)
    # a temporary folder of this process alone (others' files would count otherwise)
    tempfile.tempdir = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="dpfair-soak-tmp-")
    tmp_before = set(os.listdir(tempfile.gettempdir()))
    rows, started = [], time.perf_counter()
    for i in range(args.runs):
        t0 = time.perf_counter()
        out = CliRunner().invoke(app, ["train", "--method", "dpsgd", "--seed", str(i)])
        if out.exit_code != 0:
            raise SystemExit(f"run {i + 1} failed:\n{out.output}")
        rows.append({"run": i + 1, "seconds": time.perf_counter() - t0,
                     **_sample(project, tmp_before)})
        print(rows[-1], flush=True)
    total = time.perf_counter() - started
    keys = ["rss_mib", "fds", "threads", "tmp_entries", "leftovers"]
    second, last = rows[min(1, len(rows) - 1)], rows[-1]
    lines = [
        f"# Soak: {args.runs} `dpfair train` runs in one process",
        "",
        f"Measured on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC with "
        f"`benchmarks/soak_train.py` on {cpu_model()}, {os.cpu_count()} logical cores, Python "
        f"{sys.version.split()[0]}; load average {load_average()} at the end; {total:.0f} s in "
        "all. Each run: dpsgd, logistic regression, 2 epochs on a 600-row census CSV, a local "
        "SQLite MLflow store and ledger; figures after the run, the garbage collected.",
        "",
        "| figure | run 1 | run 2 | last run | last / run 2 |",
        "|---|---|---|---|---|",
    ]
    for key in keys:
        ratio = last[key] / second[key] if second[key] else (1.0 if not last[key] else
                                                              float("inf"))
        lines.append(f"| {key} | {rows[0][key]:.1f} | {second[key]:.1f} | {last[key]:.1f} | "
                     f"{ratio:.3f} |")
    lines += ["", "Per run:", "", "| run | seconds | " + " | ".join(keys) + " |",
              "|---" * (len(keys) + 2) + "|"]
    lines += [f"| {r['run']} | {r['seconds']:.1f} | " + " | ".join(f"{r[k]:.1f}" for k in keys)
              + " |" for r in rows]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
