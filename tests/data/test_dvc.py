"""`dvc repro` of the prepare stages in a plain temporary copy of the repo (no git)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpfair.data import data_version
from dpfair.data.prepared import PUBLIC_SUMMARY
from dpfair.data.sources import md5sum

FILES = ("params.yaml", "dvc.yaml", ".dvcignore", ".dvc/config")


def _copy_repo(repo_root: Path, dest: Path) -> Path:
    dest.mkdir()
    shutil.copytree(
        repo_root / "dpfair", dest / "dpfair", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in FILES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo_root / name, dest / name)
    return dest


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPFAIR_")}
    env["DVC_NO_ANALYTICS"] = "1"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _dvc(cwd: Path, *args: str, quiet: bool = False) -> str:
    """dvc's output (stdout and stderr; stdout only when ``quiet``); fails on an error."""
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=cwd, env=_env(),
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout if quiet else proc.stdout + proc.stderr


@pytest.fixture
def workspace(tmp_path, repo_root, mirror):
    """tmp/repo (plain copy, no .git) with tmp/shared/datasets -> the real mirror beside it."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "datasets").symlink_to(mirror, target_is_directory=True)
    return _copy_repo(repo_root, tmp_path / "repo")


def test_dvc_config_is_scm_free(repo_root):
    config = (repo_root / ".dvc" / "config").read_text()
    assert "no_scm = True" in config
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    assert "celeba" not in stages["prepare"]["foreach"]
    assert stages["prepare"]["foreach"] == [
        "adult", "dutch", "mnist", "fashion_mnist", "digits", "synthetic"
    ]


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

    # the summaries are DVC metrics: public facts only, no exact per-group / per-class counts
    shown = _dvc(workspace, "metrics", "show", "--json", quiet=True)
    files = json.loads(shown)[""]["data"]  # "": the workspace (no git revisions)
    for name in ("adult", "dutch"):
        assert files[f"data/prepared/{name}/summary.json"]["data"]["privacy"] == PUBLIC_SUMMARY
    assert "per_group" not in shown and "per_class" not in shown
    table = _dvc(workspace, "metrics", "show")
    assert "rows.train" in table and "per_group" not in table and "per_class" not in table

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
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=workspace, check=True)
    subprocess.run([*git, "add", "-A"], cwd=workspace, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=workspace, check=True)
    _dvc(workspace, "repro", "prepare@synthetic")
    assert data_version("synthetic", workspace / "dvc.lock") == md5sum(
        workspace / "data" / "prepared" / "synthetic" / "arrays.npz"
    )
    assert "didn't change" in _dvc(workspace, "repro", "prepare@synthetic")
