"""What a user sees of `dpfair run` (issue 43): on the default params.yaml, a few lines of
dpfair's own (one per step), the table and where things are; no third-party INFO line (Prefect's
task runs, Optuna's new study, MLflow's "View run", DVC's stage and its command's table), at
most 25 lines, none wider than 120 columns. The real command, in a process of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder with a short path, as a user's project has (pytest's own are ~70 characters,
    and the printed `mlflow ui` command names the store by its absolute path)."""
    folder = Path(tempfile.mkdtemp(prefix="dpfair-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_dpfair_run_on_the_default_params_is_short_and_fits_120_columns(short_tmp, repo_root):
    tmp_path = short_tmp
    for part in ("dvc.yaml", "params.yaml"):
        shutil.copy(repo_root / part, tmp_path / part)
    shutil.copytree(repo_root / "bin", tmp_path / "bin")
    shutil.copytree(repo_root / ".dvc", tmp_path / ".dvc",
                    ignore=shutil.ignore_patterns("tmp", "cache"))
    (tmp_path / ".dvc" / "config.local").write_text("[core]\n    no_scm = true\n")
    shutil.copytree(repo_root / "dpfair" / "data", tmp_path / "dpfair" / "data",
                    ignore=shutil.ignore_patterns("__pycache__"))  # the prepare stage's deps
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "raw" / ".gitkeep").touch()  # as in the repository
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["experiment"]["train"]["epochs"] = 2  # the lines do not depend on the epochs
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API", "PREFECT_LOGGING", "MLFLOW_", "DASK_"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    done = subprocess.run([str(BIN / "dpfair"), "run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    lines = output.splitlines()
    assert len(lines) <= 25, output
    assert max(len(line) for line in lines) <= 120, output
    for noise in ("Task run", "A new study created", "View run", "Running stage",
                  "summary.json", "INFO"):
        assert noise not in output, output
    assert [line.split(":")[0] for line in done.stderr.splitlines()] == [
        "prepare", "reserve", "tune and train"], done.stderr
    assert "groups: worst " in done.stdout  # by name
    assert "pair 2 vs 8" in done.stdout and "left out here" in done.stdout
    # the same table from MLflow, later: the run's groups.json chooses the same columns
    shown = subprocess.run([str(BIN / "dpfair"), "-q", "results"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0 and not shown.stderr, shown.stdout + shown.stderr
    table = done.stdout.split("full table, notes")[0].splitlines()[1:]  # without the title
    assert shown.stdout.splitlines()[1:len(table) + 1] == table, shown.stdout


def test_dpfair_run_quiet_on_a_local_dask_cluster_prints_the_table_only(tmp_path, repo_root):
    """`dpfair -q run` with `pipeline.task_runner: dask` (a local cluster: scheduler and worker
    processes): stdout is the results table, stderr is empty: none of Dask's INFO lines (the
    issue counted 37), nor Prefect's, nor dp_accounting's absl warnings from the worker."""
    pytest.importorskip("prefect_dask", reason="prefect-dask is not installed (pyproject.toml)")
    from tests.flows.conftest import SMALL_EXPERIMENT, make_workspace

    experiment = {**SMALL_EXPERIMENT, "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0],
                  "nonprivate_reference": False,
                  "train": {**SMALL_EXPERIMENT["train"], "epochs": 1}}
    make_workspace(tmp_path, repo_root, experiment,
                   pipeline={"task_runner": "dask", "max_workers": 1, "use_dvc": False})
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API", "PREFECT_LOGGING", "MLFLOW_", "DASK_"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    done = subprocess.run([str(BIN / "dpfair"), "-q", "run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stderr == "", done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("synthetic: pipeline run ") and lines[-1].startswith("ε by: ")
    assert max(len(line) for line in lines) <= 120, done.stdout
    for noise in ("INFO", "WARNING", "distributed", "absl", "Task run", "View run"):
        assert noise not in done.stdout, done.stdout
