"""A command imports what it uses and nothing else (its fixed cost: the CLI module loads no
library, `dpfair train` neither torch's compiler, matplotlib nor scikit-learn). Checked in a
fresh interpreter by the modules loaded, never by a time."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import yaml

#: loaded by no command that does not draw, compile or read scikit-learn's data
HEAVY = ("torch._dynamo", "matplotlib", "sklearn")


def _loaded(code: str, watched: tuple[str, ...], cwd: Path) -> list[str]:
    """The modules of ``watched`` loaded once ``code`` ran in a fresh interpreter (at exit)."""
    probe = ("import atexit, sys\n"
             f"atexit.register(lambda: print('LOADED', sorted(m for m in {watched!r} "
             "if m in sys.modules)))\n" + code)
    done = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    return ast.literal_eval(line.removeprefix("LOADED "))


def test_the_cli_module_loads_no_library(tmp_path):
    watched = ("torch", *HEAVY, "mlflow", "prefect", "optuna", "dvc", "pandas")
    assert _loaded("import dpfair.cli.commands", watched, tmp_path) == []


def test_train_on_digits_loads_neither_the_compiler_nor_matplotlib_nor_sklearn(tmp_path):
    """`dpfair train` on the embedded digits: the optimizer without ``torch._dynamo``, the
    digits without scikit-learn, no figure; and no Prefect (no flow runs)."""
    params = {
        "datasets": {"digits": {"seed": 0, "validation_fraction": 0.1, "test_fraction": 0.2}},
        "experiment": {"dataset": "digits", "model": {"name": "mlp", "hidden": [16]},
                       "train": {"epochs": 1, "batch_size": 64, "lr": 0.5, "sigma": 1.0,
                                 "delta": 1e-5, "progress": False},
                       "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0]},
        "tracking": {"uri": "sqlite:///mlflow.db", "artifact_root": "art"},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    code = ("sys.argv = ['dpfair', '-q', 'train', '--method', 'dpsgd']\n"
            "from dpfair.cli import main\nmain()\n")
    assert _loaded(code, (*HEAVY, "prefect"), tmp_path) == []


def test_the_ledger_loads_no_torch(tmp_path):
    """The privacy ledger (``dpfair.ledger``: reserve, charge, the budget check) reads no model:
    a process that only books a release, or a team member's ledger command, loads no torch."""
    assert _loaded("import dpfair.ledger", ("torch",), tmp_path) == []


def test_data_prepare_loads_no_torch(tmp_path):
    """`dpfair data prepare` (each DVC prepare stage) splits and writes arrays: no model, so no
    torch (``Split`` makes its tensors on first use)."""
    code = ("sys.argv = ['dpfair', '-q', 'data', 'prepare', 'synthetic']\n"
            "from dpfair.cli import main\nmain()\n")
    assert _loaded(code, ("torch",), tmp_path) == []
    assert (tmp_path / "data" / "prepared" / "synthetic" / "arrays.npz").is_file()


def test_reading_results_loads_no_model_code(tmp_path):
    """`dpfair results` reads a run's tables from MLflow, `dpfair evaluate` (DVC's evaluate
    stage) from its folder: neither loads torch, matplotlib or Optuna, and evaluate not the
    accountants either (the table's labels: :mod:`dpfair.release.labels`)."""
    results = "import dpfair.cli.results, dpfair.pipeline.preflight, dpfair.tracking.runs"
    assert _loaded(results, ("torch", *HEAVY, "optuna"), tmp_path) == []
    evaluate = "import dpfair.owned_dir, dpfair.pipeline.dvc_outputs"
    assert _loaded(evaluate, ("torch", *HEAVY, "optuna", "dp_accounting"), tmp_path) == []
