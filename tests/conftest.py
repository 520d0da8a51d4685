"""Shared fixtures for the whole test suite. Keep minimal; area fixtures live in tests/<area>/."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

# Tools must never phone home from tests.
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]


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
