"""Time from a dpfair command to its one error, for the wrong inputs of issue 27 (target:
under 3 s on the 2-core machine), against the imports each case cannot avoid.

The cases: `dpfair run` on `tests/cli/test_fail_fast.py`'s wrong settings (an own census CSV; a
misspelt key, a wrong `experiment.pair`, a category missing from its declaration, a BatchNorm
model); `dpfair train`, `tune` and `audit` on the BatchNorm model; `dpfair predict` given a
file that is no table, and a row whose category the model never saw. A misspelt key needs
Python only; a pair or a category needs the table read (pandas); a model check needs torch as
well (it builds the model); a row to predict needs MLflow (the model's rules are in its
tracking store). Every floor imports with the garbage collector paused and ends with its
objects frozen, as a refusal in `dpfair`'s own process does (dpfair.cli.console.checking).
Each round runs every arm once as a fresh process, with dpfair's telemetry switches
(dpfair.NO_TELEMETRY) set for all, in a new random order, so load changes hit all arms
alike; the table gives wall seconds (median, min–max), the child's CPU seconds, and each
case's median over the median of the floor it needs (the part dpfair can still act on).

    .venv/bin/python benchmarks/fail_fast.py            # 7 rounds, about four minutes

Writes benchmarks/results/fail_fast_runs.md (``--out`` to change).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from machine import cpu_model, load_average

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dpfair import NO_TELEMETRY  # noqa: E402
from tests.cli.conftest import CENSUS_PARAMS as BASE  # noqa: E402
from tests.cli.test_fail_fast import BN_MODULE, CASES  # noqa: E402
from tests.data.own_tables import census_frame  # noqa: E402

#: the BatchNorm case with the collector running during the checks (as before dpfair.cli.console.
#: checking paused it), and ended as app() called from Python ends (nothing frozen, as before
#: dpfair.cli.main): each one's effect, measured in the same rounds
UNPAUSED = "batchnorm, collector not paused"
UNFROZEN = "batchnorm, objects not frozen at the exit"
SINGLE = ("train", "tune", "audit")  # the single-method commands, on the BatchNorm model
#: how dpfair's checks run (the collector paused) and how a refusal ends its process
PAUSED, FROZEN = "import gc; gc.disable()", "gc.freeze()"
FLOORS = {name: [sys.executable, "-c", f"{PAUSED}; {imports}{FROZEN}"] for name, imports in {
    "floor: python": "", "floor: python + pandas": "import pandas; ",
    "floor: python + torch + pandas": "import torch, pandas; ",
    "floor: python + mlflow + pandas": "import mlflow, pandas; "}.items()}
#: set by _predict_cases: MLflow's own lookup of the logged model in its store
LOOKUP = "floor: python + mlflow + pandas + finding the model in the store"
#: the floor each case needs: what it must import to find its error
NEEDS = {"typo": "floor: python", "pair": "floor: python + pandas",
         "categories": "floor: python + pandas", "batchnorm": "floor: python + torch + pandas",
         **{f"batchnorm, dpfair {command}": "floor: python + torch + pandas"
            for command in SINGLE},
         UNPAUSED: "floor: python + torch + pandas", UNFROZEN: "floor: python + torch + pandas",
         "predict: no table": "floor: python + pandas",
         "predict: unseen category": LOOKUP}


def _workspace(folder: Path) -> dict[str, list[str]]:
    """The census table, the BatchNorm module and one params file per case; the commands."""
    census_frame(600).to_csv(folder / "census.csv", index=False)
    (folder / "bn_models.py").write_text(BN_MODULE)
    edits = {name: edit for name, (edit, _, _) in CASES.items()}
    edits["typo"] = lambda p: p["experiment"].update(datset=p["experiment"].pop("dataset"))
    commands = dict(FLOORS)
    for name, edit in edits.items():
        params = copy.deepcopy(BASE)
        edit(params)
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(params))
        commands[name] = [sys.executable, "-m", "dpfair.cli", "run", "--params", f"{name}.yaml"]
    run_bn = "sys.argv = ['dpfair', 'run', '--params', 'batchnorm.yaml']; from dpfair.cli import"
    commands[UNPAUSED] = [sys.executable, "-c",
                          f"import gc, sys; gc.disable = lambda: None; {run_bn} main; main()"]
    commands[UNFROZEN] = [sys.executable, "-c", f"import sys; {run_bn} app; app()"]
    params = copy.deepcopy(BASE)
    edits["batchnorm"](params)
    params["tuning"] = {"spaces": {"dpsgd": {"lr": [0.1, 0.5]}}}
    (folder / "single.yaml").write_text(yaml.safe_dump(params))
    for command in SINGLE:
        commands[f"batchnorm, dpfair {command}"] = [
            sys.executable, "-m", "dpfair.cli", command, "--method", "dpsgd", "--params",
            "single.yaml"]
    commands.update(_predict_cases(folder))
    return commands


def _predict_cases(folder: Path) -> dict[str, list[str]]:
    """A census model logged in a SQLite store of ``folder`` (tests/conftest.py's quick
    training) and `dpfair predict` on a Parquet file named .csv and on a row with an unseen
    category."""
    from dpfair.data.tabular_frame import dataset_from_frame
    from tests.data.own_tables import CENSUS_OPTIONS as OPTIONS
    from tests.tracking.conftest import train_and_log

    frame = census_frame()
    tracking, _, uri = train_and_log(folder, dataset_from_frame(frame, name="census", **OPTIONS),
                                     {"name": "mlp", "hidden": [8]}, "census")
    frame.head(5).to_parquet(folder / "junk.csv")
    rows = frame.head(20).copy()
    rows.loc[5, "Activity"] = 999
    rows.to_csv(folder / "unseen.csv", index=False)
    (folder / "store.yaml").write_text(yaml.safe_dump(
        {"tracking": {"uri": tracking.uri, "artifact_root": tracking.artifact_root}}))
    command = [sys.executable, "-m", "dpfair.cli", "predict", "--model", uri, "--output",
               "out.csv", "--params", "store.yaml", "--input"]
    lookup = (f"{PAUSED}; import mlflow, pandas; from mlflow.tracking import MlflowClient; "
              f"MlflowClient({tracking.uri!r}).get_logged_model({uri.removeprefix('models:/')!r})"
              f"; {FROZEN}")
    return {LOOKUP: [sys.executable, "-c", lookup],
            "predict: no table": [*command, "junk.csv"],
            "predict: unseen category": [*command, "unseen.csv"]}


def _timed(command: list[str], cwd: Path, expected: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one run, which must exit with ``expected`` (a floor 0, a case
    its error's 2)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **NO_TELEMETRY})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expected:
        raise SystemExit(f"{' '.join(command)}: exit code {done.returncode}\n{done.stdout}"
                         f"{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/fail_fast_runs.md")
    args = parser.parse_args()
    started, load_start = dt.datetime.now(dt.UTC), load_average()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        commands = _workspace(folder)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        order = list(commands)
        for _ in range(args.rounds):
            random.shuffle(order)
            for name in order:
                times[name].append(_timed(commands[name], folder,
                                          0 if name.startswith("floor") else 2))
    medians = {name: statistics.median(w for w, _ in runs) for name, runs in times.items()}
    rows = []
    for name, runs in times.items():
        walls = sorted(w for w, _ in runs)
        over = f"+{medians[name] - medians[NEEDS[name]]:.2f}" if name in NEEDS else ""
        under = f"{sum(w < 3 for w in walls)} of {len(walls)}" if name in NEEDS else ""
        rows.append(f"| {name} | {medians[name]:.2f} | {walls[0]:.2f}–{walls[-1]:.2f} | "
                    f"{statistics.median(c for _, c in runs):.2f} | "
                    f"{NEEDS.get(name, '').removeprefix('floor: ')} | {over} | {under} |")
    text = "\n".join([
        "# dpfair on wrong settings or rows: seconds to the one error (benchmarks/fail_fast.py)",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {cpu_model()}, Python {sys.version.split()[0]}; "
        f"load average {load_start} at the start, {load_average()} at the end; "
        f"{args.rounds} rounds, arms in a new random order each round.",
        "",
        "| arm | wall, median | wall, min–max | CPU, median | floor it needs | median over "
        "that floor | runs under 3 s |",
        "|---|---:|---:|---:|---|---:|---:|",
        *rows,
        "",
    ])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
