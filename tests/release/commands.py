"""Every command and API that reads private data, run as a user runs it on the private table
(:mod:`tests.release.private_table`), each in its own temporary project, with tiny settings.

A command runs in a subprocess (``python -m dpfair.cli -v ...``, or a short script for the
Python APIs), so its stdout and stderr are exactly what a user sees, with the most verbose
console (``-v``: MLflow's and Prefect's INFO lines too) and Prefect's INFO logs sent to the
server. Flows report to the Prefect server of the test session (``PREFECT_API_URL``), where
:func:`tests.release.scan.scan_prefect` reads them back.

To add a command or output: a :class:`Command` in :data:`COMMANDS` (its places: where it can
put a result), and :mod:`tests.release.scan` reads any new place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from tests.release import private_table
from tests.release.scan import snapshot

DATA = "data/raw/loans.csv"
EXPERIMENT = {
    "dataset": private_table.NAME,
    "model": {"name": "logistic_regression"},
    "train": {"epochs": 1, "batch_size": 128, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
              "progress": False},
    "methods": {"dpsgd": {"C": 1.0}, "dpsgd_f": {"C0": 1.0}},
    "seeds": [0],
    "nonprivate_reference": False,
}
TUNING = {"mode": "fixed", "n_runs": 2, "spaces": {"dpsgd": {"lr": [0.1, 0.5]}}}
#: the model's input width: income and age, and job's three declared categories
INPUT_WIDTH = 5

FIT = f"""
import pickle, sys
import pandas as pd, torch
from dpfair.api import fit
from tests.release.private_table import OPTIONS
frame = pd.read_csv({DATA!r}, keep_default_na=False)
declared = {{k: OPTIONS[k] for k in ("positive_label", "id_columns", "seed",
            "validation_fraction", "test_fraction")}}
if sys.argv[2] == "declared":
    declared.update(numeric_ranges=OPTIONS["numeric_ranges"], categories=OPTIONS["categories"])
result = fit(torch.nn.Linear({INPUT_WIDTH}, 2), frame, target="default", protected="sex",
             features=OPTIONS["features"], data_options=declared, sigma=1.0, epochs=1,
             batch_size=128, lr=0.5, C=1.0, progress=False)
print(f"epsilon {{result.epsilon:.3f}}, test accuracy {{result.test_metrics['accuracy']:.3f}}")
with open(sys.argv[1], "wb") as out:
    pickle.dump(result, out)
"""

RETRAIN = """
import pickle, sys
from pathlib import Path
from flows.schedule import retrain_flow
states = [retrain_flow(params_path="params.yaml", root=".", return_state=True)  # retrains,
          for _ in range(2)]                                                     # then skips
returned = [state.result() for state in states]
print(*returned)
with open(sys.argv[1], "wb") as out:
    pickle.dump(returned, out)
Path(sys.argv[1] + ".flow_runs").write_text(
    "\\n".join(str(state.state_details.flow_run_id) for state in states))
from prefect.logging.handlers import APILogWorker
APILogWorker.drain_all()  # every log line on the server before it is read back
"""

#: ``dpfair train`` with a planted leak (tests that the release test can fail): the training
#: rows' mean of ``income`` logged as a param of its MLflow run, its standard deviation
#: printed, and both saved as float32 in a file under outputs/
LEAKY_TRAIN = """
import sys
import numpy as np
from mlflow import MlflowClient
import dpfair.pipeline.standalone as standalone
from dpfair.cli import main
from tests.release.private_table import frame, markers

stats = markers(frame()).floats
mean, std = stats["mean of income, training rows"], stats["std (ddof 0) of income, training rows"]
real = standalone.train_logged

def leaky(config, label, dataset, tracking, *args, **kwargs):
    result, record = real(config, label, dataset, tracking, *args, **kwargs)
    MlflowClient(tracking.uri).log_param(record.run_id, "income_mean", mean)
    print(f"income: sd {std:.6g}")
    np.savez_compressed("outputs/summary.npz", stats=np.array([mean, std], np.float32))
    return result, record

standalone.train_logged = leaky
sys.argv = ["dpfair", "-v", "train", "--method", "dpsgd"]
main()
"""


@dataclass(frozen=True)
class Command:
    """One way private data is read: ``argv`` of ``dpfair -v`` or a Python ``script`` (its
    argv: the file it pickles what it returned into, then ``script_arg``), in ``project``
    (None: its own; a name: the project another command ran in, after it)."""

    name: str
    places: tuple[str, ...]
    argv: tuple[str, ...] = ()
    script: str = ""
    script_arg: str = ""
    project: str | None = None
    tuning_release: str = "selected"
    dvc: bool = False
    #: files of :data:`tests.release.scan.ALLOWLIST` this command releases (searched)
    releases: tuple[str, ...] = ()
    #: globs of files the command must have written (and the scan read)
    writes: tuple[str, ...] = ()
    #: kinds of MLflow entry the command must have logged (words of the scan's item names)
    logs: tuple[str, ...] = ("params", "tags", "metrics", "artifact")
    #: the dataset declares no range or category: budget.allow_fitted_preprocessing
    fitted: bool = False
    #: ``place:where`` globs of README's documented releases of private statistics in this
    #: command: findings there are expected (and must be found: the reason is real)
    documented: tuple[str, ...] = ()


#: what a training command logs: a run with its data as an input, a model, a registered version
TRAINED = ("params", "metrics", "dataset input", "artifact", "logged model", "registered model")

COMMANDS = [
    Command("run", ("mlflow", "files", "prefect", "stdout", "stderr"), ("run",),
            writes=("outputs/*/results.md", "outputs/*/results.csv",
                    "data/prepared/loans/summary.json", "mlflow.db", "mlartifacts/*.pt"),
            logs=TRAINED),
    Command("train", ("mlflow", "files", "stdout", "stderr"),
            ("train", "--method", "dpsgd_f", "--register"), logs=TRAINED),
    # README's release table: with budget.allow_fitted_preprocessing the transform inside the
    # logged and registered model holds the training rows' exact means and standard
    # deviations (not covered by ε); nowhere else
    Command("train fitted", ("mlflow", "files", "stdout", "stderr"),
            ("train", "--method", "dpsgd", "--register"), logs=TRAINED, fitted=True,
            documented=("mlflow:logged model *preprocessor.json",
                        "files:mlartifacts/*/preprocessor.json")),
    Command("tune selected", ("mlflow", "files", "stdout", "stderr"),
            ("tune", "--method", "dpsgd")),
    Command("tune all_trials", ("mlflow", "files", "stdout", "stderr"),
            ("tune", "--method", "dpsgd"), tuning_release="all_trials",
            releases=("*.ledger.PRIVATE.json",)),  # README: K and every trial released
    Command("audit", ("mlflow", "files", "stdout", "stderr"),
            ("audit", "--method", "dpsgd", "--canaries", "20")),
    Command("data prepare", ("files", "stdout", "stderr"), ("data", "prepare", "loans"),
            writes=("data/prepared/loans/summary.json",)),
    Command("fit", ("files", "stdout", "stderr", "returned"), script=FIT,
            script_arg="declared"),
    Command("fit undeclared", ("files", "stdout", "stderr", "returned"), script=FIT,
            script_arg="fitted"),
    Command("predict", ("mlflow", "files", "stdout", "stderr"),
            ("predict", "--model", "dpfair-loans", "--input", "new_rows.csv", "--output",
             "predictions.csv"), project="run", writes=("predictions.csv",)),
    Command("results", ("mlflow", "files", "stdout", "stderr"), ("results",), project="run"),
    Command("results --full", ("mlflow", "files", "stdout", "stderr"), ("results", "--full"),
            project="run"),
    Command("retrain", ("mlflow", "files", "prefect", "stdout", "stderr", "returned"),
            script=RETRAIN, logs=TRAINED),
    Command("dvc exp run", ("mlflow", "files", "prefect", "stdout", "stderr"), dvc=True,
            writes=("dvc.lock", "evaluation/metrics.json", "evaluation/group_accuracy.csv",
                    "evaluation/epsilon_accuracy.csv", "outputs/pipeline/results.md",
                    "data/prepared/loans/summary.json", ".git/objects/*"), logs=TRAINED),
]
PLANTED = Command("train with a planted leak", ("mlflow", "files", "stdout"),
                  script=LEAKY_TRAIN)
BY_NAME = {c.name: c for c in [*COMMANDS, PLANTED]}


@dataclass
class Outcome:
    """What one command left: its project, its console, when it ran, what it returned."""

    command: Command
    root: Path
    before: dict[str, tuple[int, int]]
    stdout: str = ""
    stderr: str = ""
    returncode: int = 0
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    until: datetime | None = None
    returned: bytes | None = None
    flow_runs: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return (self.until - self.since).total_seconds() if self.until else float("nan")

    @property
    def prefect_home(self) -> Path:
        """The command's own PREFECT_HOME (Prefect's local result storage, its settings)."""
        return self.root.parent / f"{self.root.name}-prefect-home"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"


def params(root: Path, tuning_release: str = "selected", fitted: bool = False) -> dict:
    dataset = {**private_table.OPTIONS, "path": DATA}
    if fitted:
        del dataset["numeric_ranges"], dataset["categories"]
    return {
        "datasets": {private_table.NAME: dataset},
        "experiment": EXPERIMENT,
        "tuning": {**TUNING, "release": tuning_release},
        "audit": {"method": "dpsgd"},
        "budget": {"allow_fitted_preprocessing": fitted},
        "pipeline": {"use_dvc": False, "max_workers": 1},
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}",
                     "artifact_root": str(root / "mlartifacts")},
    }


#: what `dvc exp run` needs of the repository (tests/data/test_dvc.py copies the same)
_DVC_FILES = ("dvc.yaml", ".dvcignore", ".gitignore", ".dvc/config", "bin/dvc-python")


def make_project(root: Path, repo_root: Path, command: Command) -> Path:
    """A project holding the private table and a params.yaml (a git repository with DVC's
    files and dpfair's code when ``command.dvc``)."""
    (root / "data" / "raw").mkdir(parents=True)
    private_table.frame().to_csv(root / DATA, index=False)
    private_table.new_rows().to_csv(root / "new_rows.csv", index=False)
    (root / "outputs").mkdir()
    settings = params(root, command.tuning_release, command.fitted)
    if command.dvc:
        for package in ("dpfair", "flows", "tasks"):
            shutil.copytree(repo_root / package, root / package,
                            ignore=shutil.ignore_patterns("__pycache__"))
        for name in _DVC_FILES:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(repo_root / name, root / name)
        settings["pipeline"]["use_dvc"] = True
        settings["tracking"] = {"uri": "sqlite:///mlflow.db", "artifact_root": "mlartifacts"}
    (root / "params.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    if command.dvc:  # README "Your own data": the file tracked by DVC, its pointer by git
        git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
        for args in (git + ["init", "-q"], [sys.executable, "-m", "dvc", "add", DATA],
                     git + ["add", "-A"], git + ["commit", "-qm", "private table"]):
            subprocess.run(args, cwd=root, check=True, capture_output=True)
    return root


def environment(prefect_api: str) -> dict[str, str]:
    """This session's environment without dpfair's, MLflow's and Prefect's settings, with
    Prefect's server and INFO logs (every log line reaches the server's store)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DPFAIR_", "MLFLOW_", "PREFECT_", "PYTEST_"))}
    repo = str(Path(__file__).resolve().parents[2])
    env.update(PREFECT_API_URL=prefect_api, PREFECT_LOGGING_LEVEL="INFO", COLUMNS="120",
               PYTHONPATH=os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")])))
    return env


def start(command: Command, root: Path, env: dict[str, str]) -> tuple[Outcome, subprocess.Popen]:
    """Start ``command`` in project ``root`` (its outcome is complete after :func:`finish`)."""
    outcome = Outcome(command, root, snapshot(root))
    env = {**env, "PREFECT_HOME": str(outcome.prefect_home)}
    returned = root.parent / f"{root.name}-returned.pickle"
    if command.dvc:
        args = [sys.executable, "-m", "dvc", "exp", "run", "evaluate"]
    elif command.script:
        args = [sys.executable, "-c", command.script, str(returned), command.script_arg]
    else:
        args = [sys.executable, "-m", "dpfair.cli", "-v", *command.argv]
    process = subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    return outcome, process


def finish(outcome: Outcome, process: subprocess.Popen, timeout: float = 300) -> Outcome:
    outcome.stdout, outcome.stderr = process.communicate(timeout=timeout)
    outcome.returncode = process.returncode
    outcome.until = datetime.now(UTC)
    returned = outcome.root.parent / f"{outcome.root.name}-returned.pickle"
    if returned.exists():
        outcome.returned = returned.read_bytes()
    if (ids := Path(f"{returned}.flow_runs")).exists():
        outcome.flow_runs = ids.read_text().split()
    return outcome
