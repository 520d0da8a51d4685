"""`dvc repro` in temporary copies of the repo: the prepare stages (also without git), and the
whole pipeline (prepare -> run -> evaluate) on a tiny configuration in a git repository, with
DVC's metrics, plots and params diff. DVC runs with this interpreter and the venv NOT on PATH:
the stage commands find the interpreter that runs DVC (bin/dvc-python)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dpfair.accounting.accountant import ACCOUNTANTS
from dpfair.data import data_version
from dpfair.data.prepared import PUBLIC_SUMMARY
from dpfair.data.sources import md5sum
from dpfair.errors import DataError

FILES = ("params.yaml", "dvc.yaml", ".dvcignore", ".gitignore", ".dvc/config",
         "bin/dvc-python", "data/raw/.gitkeep")


def _copy_repo(repo_root: Path, dest: Path, packages: tuple[str, ...] = ("dpfair",)) -> Path:
    dest.mkdir()
    for package in packages:
        shutil.copytree(repo_root / package, dest / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in FILES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo_root / name, dest / name)
    return dest


def _env() -> dict[str, str]:
    """The environment without dpfair's settings and with this interpreter's directory (the
    venv's bin) removed from PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DPFAIR_", "MLFLOW_", "PREFECT_"))}
    env["DVC_NO_ANALYTICS"] = "1"
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p) != Path(venv_bin))
    return env


def _dvc(cwd: Path, *args: str, quiet: bool = False, **env: str) -> str:
    """dvc's output (stdout and stderr; stdout only when ``quiet``); fails on an error."""
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=cwd, env={**_env(), **env},
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout if quiet else proc.stdout + proc.stderr


@pytest.fixture
def workspace(tmp_path, repo_root, mirror):
    """tmp/repo (plain copy, no .git: DVC told so in .dvc/config.local) with
    tmp/shared/datasets -> the real mirror beside it."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "datasets").symlink_to(mirror, target_is_directory=True)
    repo = _copy_repo(repo_root, tmp_path / "repo")
    (repo / ".dvc" / "config.local").write_text("[core]\n    no_scm = true\n")
    return repo


def test_dvc_pipeline_definition(repo_root):
    """Git is DVC's SCM (params diff, experiments); prepare -> run -> evaluate; the prepare
    summaries (split sizes) are no DVC metric; no stage command relies on PATH's python."""
    assert "no_scm" not in (repo_root / ".dvc" / "config").read_text()
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    # one prepare stage per dataset declared in params.yaml (celeba is not: ~10 GB of arrays)
    assert stages["prepare"]["foreach"] == "${datasets}"
    assert "data/raw" in stages["prepare"]["do"]["deps"]
    declared = yaml.safe_load((repo_root / "params.yaml").read_text())["datasets"]
    assert list(declared) == ["adult", "dutch", "mnist", "fashion_mnist", "digits", "synthetic"]
    assert list(stages) == ["prepare", "run", "evaluate"]
    assert "metrics" not in stages["prepare"]["do"]
    for stage in (stages["prepare"]["do"], stages["run"], stages["evaluate"]):
        assert stage["cmd"].startswith("sh bin/dvc-python -m dpfair.cli ")
    # persisted: a refused or failed run leaves the previous results (the command replaces them)
    assert "outputs/pipeline" in stages["evaluate"]["deps"] and stages["run"]["outs"] == [
        {"outputs/pipeline": {"persist": True}}]
    # run depends on its dataset's prepared arrays: `dvc dag` draws prepare -> run
    assert "data/prepared/${experiment.dataset}/arrays.npz" in stages["run"]["deps"]


@pytest.mark.slow
def test_repro_adult_dutch_then_noop(workspace):
    assert not (workspace / ".git").exists()
    _dvc(workspace, "repro", "prepare@adult", "prepare@dutch")
    lock = workspace / "dvc.lock"
    lock_text = lock.read_text()
    for name, total in (("adult", 28_000), ("dutch", 60_420)):
        arrays = workspace / "data" / "prepared" / name / "arrays.npz"
        assert data_version(name, lock) == md5sum(arrays)
        summary = json.loads((arrays.parent / "summary.json").read_text())
        assert summary["rows"]["total"] == total
    assert data_version("mnist", lock) is None  # not reproduced

    # the summaries hold public facts only (no exact per-group / per-class counts) and are
    # no DVC metric (they hold split sizes)
    for name in ("adult", "dutch"):
        summary = json.loads((workspace / "data/prepared" / name / "summary.json").read_text())
        assert summary["privacy"] == PUBLIC_SUMMARY
        assert "per_group" not in summary and "per_class" not in summary
    assert "summary.json" not in _dvc(workspace, "metrics", "show", "--json", quiet=True)

    out = _dvc(workspace, "repro", "prepare@adult", "prepare@dutch")
    assert "Stage 'prepare@adult' didn't change, skipping" in out
    assert "Stage 'prepare@dutch' didn't change, skipping" in out
    assert "Running stage" not in out
    assert lock.read_text() == lock_text
    assert "up to date" in _dvc(workspace, "status", "prepare@adult", "prepare@dutch")

    # a changed parameter re-runs only that stage
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["datasets"]["dutch"]["seed"] = 1
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    out = _dvc(workspace, "status", "prepare@adult", "prepare@dutch")
    assert "prepare@dutch" in out and "prepare@adult" not in out


@pytest.mark.slow
def test_repro_inside_a_git_clone(workspace):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    (workspace / ".dvc" / "config.local").unlink()
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=workspace, check=True)
    subprocess.run([*git, "add", "-A"], cwd=workspace, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=workspace, check=True)
    _dvc(workspace, "repro", "prepare@synthetic")
    assert data_version("synthetic", workspace / "dvc.lock") == md5sum(
        workspace / "data" / "prepared" / "synthetic" / "arrays.npz"
    )
    assert "didn't change" in _dvc(workspace, "repro", "prepare@synthetic")


TINY = {
    "datasets": {"synthetic": {"n": 600, "n_features": 6, "minority_fraction": 0.2,
                               "class_sep": 0.3}},
    "experiment": {
        "dataset": "synthetic", "model": {"name": "logistic_regression"},
        "train": {"epochs": 2, "batch_size": 64, "lr": 0.5, "sigma": 1.0, "delta": 1e-5},
        "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0],
    },
    "tuning": {},
    "budget": {"allow_nonprivate_reference": True},
    "tracking": {"uri": "sqlite:///mlflow.db", "artifact_root": "mlartifacts"},
    "pipeline": {"max_workers": 1},
}


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                   cwd=cwd, check=True, capture_output=True)


@pytest.mark.slow
def test_pipeline_repro_metrics_plots_and_params_diff(prefect_api, tmp_path, repo_root):
    """`dvc repro evaluate` in a fresh git clone (tiny config: synthetic, dpsgd and the
    reference, one seed, 2 epochs): each stage runs once, then DVC shows the evaluate stage's
    metrics (worst-group accuracy, gap, ε per method; no training counts) and plots, and
    diffs a changed parameter. Its flows report to the session's Prefect server (the queued
    experiment's test below runs on a temporary one, as a new machine does)."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = _copy_repo(repo_root, tmp_path / "repo", ("dpfair", "flows", "tasks"))
    (repo / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "tiny")

    prefect = {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": prefect_api}
    out = _dvc(repo, "repro", "evaluate", **prefect)
    for stage in ("prepare@synthetic", "run", "evaluate"):
        assert out.count(f"Running stage '{stage}'") == 1, out

    dag = _dvc(repo, "dag", "--dot", quiet=True)
    assert '"prepare@synthetic" -> "run"' in dag and '"run" -> "evaluate"' in dag, dag
    shown = json.loads(_dvc(repo, "metrics", "show", "--json", quiet=True))
    [(_, files)] = shown.items()
    assert files["data"]["evaluation/metrics.json"]["data"] == {  # the short set
        k: v for k, v in json.loads((repo / "evaluation" / "details.json").read_text()).items()
        if k in ("epsilon_total", "worst")}
    metrics = json.loads((repo / "evaluation" / "details.json").read_text())
    assert set(metrics) == {"epsilon_total", "epsilon_total_accountant", "test_metrics", "worst",
                            "accuracy_gap", "cost_gap", "epsilon", "epsilon_run",
                            "epsilon_accountant", "group_accuracy", "privacy", "fairness"}
    # the practitioners' measures (results/fairness.csv), not DVC metrics: every rate per group
    assert set(metrics["fairness"]["demographic_parity_ratio"]) == {"dpsgd", "nonprivate"}
    assert set(metrics["fairness"]["selection_rate"]["dpsgd"]) == {"majority", "minority"}
    assert "demographic_parity_ratio_privacy_cost" in metrics["fairness"]
    assert metrics["epsilon_total_accountant"] in ACCOUNTANTS  # every ε names its accountant
    assert set(metrics["epsilon_accountant"]) == {"dpsgd"}
    assert set(metrics["worst"]) == {"dpsgd", "nonprivate"}  # fractions, not percent
    assert set(metrics["group_accuracy"]["dpsgd"]) == {"majority", "minority"}  # every group
    assert 0.0 <= metrics["worst"]["dpsgd"] <= 1.0 and 0.0 <= metrics["cost_gap"]["dpsgd"] <= 1
    assert 0.0 < metrics["epsilon_run"]["dpsgd"] <= metrics["epsilon"]["dpsgd"] == (
        metrics["epsilon_total"])
    assert set(metrics["epsilon"]) == {"dpsgd"}  # no ε without a DP guarantee: a label
    assert set(metrics["privacy"]) == {"nonprivate"}
    assert list(files["data"]) == ["evaluation/metrics.json"]  # no summary.json, no counts
    shown = _dvc(repo, "metrics", "show", quiet=True)
    assert max(map(len, shown.splitlines())) <= 120, shown

    plots = json.loads(_dvc(repo, "plots", "show", "--json", quiet=True))["data"]
    assert {"evaluation/group_accuracy.csv", "evaluation/epsilon_accuracy.csv"} <= set(plots)
    groups = {(row["method"], row["group"]) for row in
              plots["evaluation/group_accuracy.csv"][0]["content"]["data"]["values"]}
    assert ("dpsgd", "minority") in groups and ("nonprivate", "majority") in groups

    # a temporary experiment runs in a copy under .dvc/tmp/exps that DVC deletes: its MLflow
    # runs and its privacy spend land in the project's stores, not in the copy
    from dpfair.ledger import SourceLedger

    ledger = SourceLedger(".dpfair/ledger.sqlite", repo)
    assert len(ledger.releases()) == 1
    _dvc(repo, "exp", "run", "--temp", "evaluate", "-S", "experiment.seeds=[1]", **prefect)
    releases = ledger.releases()
    assert len(releases) == 2 and releases[1].status == "released"
    assert releases[1].accounts == releases[0].accounts  # the same people: they compose
    assert ledger.spent("synthetic", releases[1].version, releases[1].delta) > releases[0].epsilon
    import sqlite3

    with sqlite3.connect(repo / "mlflow.db") as db:
        pipelines = db.execute("select count(*) from tags where key = 'dpfair.stage' and "
                               "value = 'pipeline'").fetchone()[0]
    assert pipelines == 2
    # the README's `dvc exp show` fits 120 columns: DVC collapses what does not fit into "…"
    [command] = re.findall(r"\.venv/bin/dvc (exp show .*?)\s+#", (repo_root / "README.md")
                           .read_text())
    shown = _dvc(repo, *shlex.split(command), "--no-pager", quiet=True, COLUMNS="120")
    assert "…" not in shown and max(map(len, shown.splitlines())) <= 120, shown
    assert "epsilon_total " in shown and "worst.dpsgd" in shown and "accountant" not in shown
    _git(repo, "checkout", "--", "params.yaml")

    # over budget: refused before the orchestration starts, the error printed once, nothing
    # recorded, and the previous results still in outputs/pipeline (persist: true)
    results = (repo / "outputs" / "pipeline" / "results.csv").read_bytes()
    refused = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "run", "evaluate", "-S",
         "experiment.seeds=[0,1,2,3,4]", "-S", f"+budget.epsilon={1.3 * metrics['epsilon_total']}"],
        cwd=repo, env={**_env(), **prefect}, capture_output=True, text=True, timeout=300)
    printed = refused.stdout + refused.stderr
    assert refused.returncode != 0, printed  # DVC's own code; dpfair's is 3 (budget refused)
    assert printed.count("the run would release more than the budget allows") == 1, printed
    assert "Traceback" not in printed and "Task run" not in printed, printed
    assert (repo / "outputs" / "pipeline" / "results.csv").read_bytes() == results
    assert len(ledger.releases()) == 2
    _git(repo, "checkout", "--", "params.yaml")

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["experiment"]["train"]["epochs"] = 3
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    diff = json.loads(_dvc(repo, "params", "diff", "--json", quiet=True))
    changed = diff["params.yaml"]["experiment.train.epochs"]
    assert (changed["old"], changed["new"]) == (2, 3)


def test_evaluate_turns_the_results_table_into_metrics_and_plot_tables(tmp_path):
    """The evaluate stage's numbers are the table's: every group's accuracy by name, the worst
    group, the largest accuracy and cost gaps, ε only for methods with a guarantee."""
    from dpfair.accounting.accountant import ACCOUNTANT_NONE, ACCOUNTANT_PLD, ACCOUNTANT_PROFILE
    from dpfair.pipeline.dvc_outputs import TEST_METRICS_LABEL, write_outputs
    from dpfair.release.labels import (
        EPSILON_ACCOUNTANT,
        EPSILON_METHOD,
        EPSILON_RUN,
        EPSILON_TEST,
        HEURISTIC,
        NONPRIVATE_REFERENCE,
    )

    table = pd.DataFrame(
        {"acc_2": ["98.0 ± 0.1", "90.0 ± 0.5", "91.0 ± 0.4", ""],
         "acc_8": ["90.0 ± 0.3", "60.5 ± 2.0", "70.0 ± 1.0", ""],
         "acc_9": ["89.5 ± 0.3", "61.0 ± 2.0", "69.5 ± 1.0", ""],
         "acc_worst_group": ["89.5 ± 0.2", "60.5 ± 2.0", "69.0 ± 1.0", ""],
         "acc_gap_max": ["8.5 ± 0.2", "29.5 ± 2.0", "21.0 ± 1.0", ""],
         "pi_gap": ["-", "22.0 ± 2.0", "14.0 ± 1.0", ""],
         "pi_gap_max": ["-", "25.0 ± 2.0", "15.0 ± 1.0", ""],
         EPSILON_RUN: [NONPRIVATE_REFERENCE, "2.81", HEURISTIC, ""],
         EPSILON_METHOD: [NONPRIVATE_REFERENCE, "5.62", HEURISTIC, "5.62"],
         EPSILON_ACCOUNTANT: [ACCOUNTANT_NONE, f"run: {ACCOUNTANT_PLD}; method: "
                              f"{ACCOUNTANT_PROFILE}", ACCOUNTANT_NONE, ACCOUNTANT_PROFILE]},
        index=pd.Index(["nonprivate", "dpsgd (replayable noise)", "fairlens",
                        "run total: private releases composed (...)"], name="method"))
    table.to_csv(tmp_path / "results.csv")
    paths = write_outputs(tmp_path / "results.csv", tmp_path / "evaluation")
    metrics = json.loads(paths["details.json"].read_text())
    # the labels MLflow shows travel with the numbers: no ε, replayable noise, exact tests
    assert metrics == {
        "epsilon_total": 5.62, "test_metrics": TEST_METRICS_LABEL,
        "worst": {"nonprivate": 0.895, "dpsgd": 0.605, "fairlens": 0.69},
        "accuracy_gap": {"nonprivate": 0.085, "dpsgd": 0.295, "fairlens": 0.21},
        "cost_gap": {"dpsgd": 0.25, "fairlens": 0.15},
        "epsilon": {"dpsgd": 5.62}, "epsilon_run": {"dpsgd": 2.81},
        "epsilon_accountant": {"dpsgd": f"run: {ACCOUNTANT_PLD}; method: {ACCOUNTANT_PROFILE}"},
        "epsilon_total_accountant": ACCOUNTANT_PROFILE,
        "group_accuracy": {"nonprivate": {"2": 0.98, "8": 0.9, "9": 0.895},
                           "dpsgd": {"2": 0.9, "8": 0.605, "9": 0.61},
                           "fairlens": {"2": 0.91, "8": 0.7, "9": 0.695}},
        "privacy": {"nonprivate": NONPRIVATE_REFERENCE, "fairlens": HEURISTIC},
        "note": {"dpsgd": "replayable noise"}}
    # DVC's metrics: the short set, flat (`dvc metrics show` fits 120 columns)
    assert json.loads(paths["metrics.json"].read_text()) == {
        "epsilon_total": 5.62, "worst": {"nonprivate": 0.895, "dpsgd": 0.605, "fairlens": 0.69}}
    groups = pd.read_csv(paths["group_accuracy.csv"], dtype={"group": str})
    assert len(groups) == 12 and set(groups["group"]) == {"2", "8", "9", "worst group"}
    curve = pd.read_csv(paths["epsilon_accuracy.csv"])
    assert curve.to_dict("records") == [
        {"method": "dpsgd", "epsilon": 5.62, "worst_group_accuracy": 0.605}]
    # noisy test metrics: the test split's ε per method (every method: its own rows) and total
    table[EPSILON_TEST] = ["0.9", "0.9", "0.9", "1.6"]
    table.to_csv(tmp_path / "results.csv")
    paths = write_outputs(tmp_path / "results.csv", tmp_path / "evaluation")
    metrics = json.loads(paths["details.json"].read_text())
    assert json.loads(paths["metrics.json"].read_text())["epsilon_test_total"] == 1.6
    assert metrics["epsilon_test_total"] == 1.6 and metrics["epsilon_total"] == 5.62
    assert metrics["epsilon_test"] == {"nonprivate": 0.9, "dpsgd": 0.9, "fairlens": 0.9}
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="not a results table"):
        write_outputs(tmp_path / "other.csv", tmp_path / "evaluation")


@pytest.mark.slow
def test_a_declared_own_csv_gets_its_stage_and_reruns_when_the_file_changes(tmp_path,
                                                                          repo_root):
    """Declaring a table in params.yaml is enough: `dvc add data/raw/...`, then `dvc repro`
    prepares it; a changed CSV re-runs its stage, and the new data version follows the file."""
    from tests.data.own_tables import loans_frame, table_options

    repo = _copy_repo(repo_root, tmp_path / "repo")
    (repo / ".dvc" / "config.local").write_text("[core]\n    no_scm = true\n")
    csv = repo / "data" / "raw" / "loans.csv"
    loans_frame(300).to_csv(csv, index=False)
    _dvc(repo, "add", "data/raw/loans.csv")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["datasets"] = {"loans": table_options(Path("data/raw/loans.csv"))}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _dvc(repo, "repro", "prepare@loans")
    assert "Running stage 'prepare@loans'" in out
    first = data_version("loans", repo / "dvc.lock")
    assert "didn't change" in _dvc(repo, "repro", "prepare@loans")

    loans_frame(300, seed=1).to_csv(csv, index=False)  # the file changes
    assert "prepare@loans" in _dvc(repo, "status", "prepare@loans")
    assert "Running stage 'prepare@loans'" in _dvc(repo, "repro", "prepare@loans")
    assert data_version("loans", repo / "dvc.lock") not in (None, first)


def test_dvc_metrics_show_fits_120_columns_with_the_default_methods(tmp_path, repo_root):
    """Issue 43: `dvc metrics show` was 2,037 columns wide; the metrics of the default
    experiment's four methods (the long names included) fit 120, the rest is in details.json."""
    from dpfair.accounting.accountant import ACCOUNTANT_PLD, ACCOUNTANT_PROFILE
    from dpfair.pipeline.dvc_outputs import write_outputs
    from dpfair.release.labels import EPSILON_ACCOUNTANT, EPSILON_METHOD, EPSILON_RUN

    methods = ["nonprivate", "dpsgd", "dpsgd_f", "dpsgd_global_adapt"]
    cell = "84.1 ± 12.3"
    table = pd.DataFrame(
        {**{f"acc_{d}": [cell] * 4 + [""] for d in range(10)}, "acc_worst_group": [cell] * 4 + [""],
         "acc_gap_max": [cell] * 4 + [""], "pi_gap_max": ["-"] + [cell] * 3 + [""],
         EPSILON_RUN: ["non-private reference: no DP guarantee"] + ["7.04"] * 3 + [""],
         EPSILON_METHOD: ["non-private reference: no DP guarantee"] + ["13.81"] * 3 + ["22.58"],
         EPSILON_ACCOUNTANT: [""] + [ACCOUNTANT_PLD] * 3 + [ACCOUNTANT_PROFILE]},
        index=pd.Index([*methods, "run total: private releases composed"], name="method"))
    table.to_csv(tmp_path / "results.csv")
    shutil.copytree(repo_root / ".dvc", tmp_path / ".dvc",
                    ignore=shutil.ignore_patterns("tmp", "cache"))
    (tmp_path / ".dvc" / "config.local").write_text("[core]\n    no_scm = true\n")
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"evaluate": {
        **stages["evaluate"], "deps": ["results.csv"],
        "cmd": "true"}}}))  # only what `metrics show` reads: the evaluate stage's outputs
    write_outputs(tmp_path / "results.csv", tmp_path / "evaluation")
    shown = _dvc(tmp_path, "metrics", "show", quiet=True)
    assert max(map(len, shown.splitlines())) <= 120, shown
    assert all(f"worst.{m}" in shown for m in methods) and "epsilon_total" in shown


def _hook():
    """The module `make install` puts in the venv's site-packages (bin/_dpfair_dvc_on_path.py)."""
    import importlib.util

    spec = importlib.util.find_spec("_dpfair_dvc_on_path")
    assert spec is not None, "the venv lacks bin/_dpfair_dvc_on_path.py: run `make install`"
    return importlib.import_module("_dpfair_dvc_on_path")


def test_dvc_commands_that_start_queue_workers_put_the_venvs_bin_first_on_path(repo_root):
    """The installed hook is the repository's, and it changes PATH only in the DVC commands that
    start queue workers (`.venv/bin/dvc queue start`, `python -m dvc queue start`, `dvc exp run
    --run-all`), once; every other command keeps its PATH (`dvc repro` needs nothing there)."""
    hook = _hook()
    assert Path(hook.__file__).read_bytes() == (repo_root / "bin" / "_dpfair_dvc_on_path.py"
                                                ).read_bytes(), "an older copy: `make install`"
    venv_python = "/p/.venv/bin/python"
    for argv in (["/p/.venv/bin/python", "/p/.venv/bin/dvc", "queue", "start"],
                 ["python", "-m", "dvc", "queue", "start", "-j", "2"],
                 ["python", "-I", "-m", "dvc", "-v", "--cd", "repo", "queue", "start"],
                 ["/p/.venv/bin/python", "/p/.venv/bin/dvc", "exp", "run", "--run-all"]):
        environ = {"PATH": "/usr/bin:/bin"}
        hook.put_venv_first(argv, venv_python, environ)
        assert environ["PATH"] == "/p/.venv/bin:/usr/bin:/bin", argv
        hook.put_venv_first(argv, venv_python, environ)  # once
        assert environ["PATH"] == "/p/.venv/bin:/usr/bin:/bin", argv
    for argv in (["python", "-c", "print()"], ["/p/.venv/bin/dpfair", "run"], ["python"],
                 ["/p/.venv/bin/python", "/p/.venv/bin/dvc", "repro"],
                 ["python", "-m", "dvc", "exp", "run", "--queue", "evaluate"],
                 ["python", "-m", "dvc", "--cd", "queue", "repro"],
                 ["python", "dvc_notes.py", "queue"], ["python", "-m", "dvcx", "queue"]):
        environ = {"PATH": "/usr/bin:/bin"}
        hook.put_venv_first(argv, venv_python, environ)
        assert environ == {"PATH": "/usr/bin:/bin"}, argv
    environ = {"PATH": "/other/dvc/bin:/p/.venv/bin"}  # another dvc first: the venv's first
    hook.put_venv_first(["/p/.venv/bin/python", "/p/.venv/bin/dvc", "queue", "start"],
                        venv_python, environ)
    assert environ["PATH"].split(os.pathsep)[0] == "/p/.venv/bin"


@pytest.mark.slow
def test_dvc_queue_start_works_without_the_venv_on_path(tmp_path, repo_root):
    """Issue 43: `.venv/bin/dvc queue start` from a shell without the venv on PATH printed
    "Started" and its worker failed on "no such file: 'dvc'" (DVC starts it by name). In a git
    clone with the tiny pipeline: a queued experiment runs the whole pipeline and succeeds."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    _hook()
    repo = _copy_repo(repo_root, tmp_path / "repo", ("dpfair", "flows", "tasks"))
    (repo / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "tiny")
    env = {**_env(), "PREFECT_HOME": str(tmp_path / "prefect")}
    assert shutil.which("dvc", path=env["PATH"]) is None  # nothing else to find
    dvc = str(Path(sys.executable).parent / "dvc")  # the venv's script, as a user types it

    def run(*args: str) -> str:
        done = subprocess.run([dvc, *args], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run("exp", "run", "--queue", "evaluate", "-S", "experiment.seeds=[1]", "--name", "seed1")
    assert "Started" in run("queue", "start")

    def state() -> str:  # the experiment's line of `dvc queue status`: its last word
        [line] = [line for line in run("queue", "status").splitlines() if " seed1 " in line]
        return line.split()[-1]

    def committed() -> bool:  # DVC's worker commits a finished experiment under refs/exps
        refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"],
                              cwd=repo, capture_output=True, text=True, check=True).stdout
        return any(ref.endswith("/seed1") for ref in refs.split())

    # until the worker has finished the experiment (or given up): git's refs each second (a
    # few ms), DVC's own status (a Python process of its own) every 15 s and once committed
    for second in range(600):
        if (committed() or second % 15 == 14) and state() not in ("Queued", "Running"):
            break
        time.sleep(1)
    assert state() == "Success", run("queue", "status") + run("queue", "logs", "seed1")
    shown = json.loads(run("exp", "show", "--json"))
    [experiment] = [e for row in shown for e in row.get("experiments") or ()
                    if e.get("name") == "seed1"]
    [revision] = experiment["revs"]
    metrics = revision["data"]["metrics"]["evaluation/metrics.json"]["data"]
    assert set(metrics["worst"]) == {"dpsgd", "nonprivate"} and metrics["epsilon_total"] > 0
