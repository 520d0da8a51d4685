"""The package: importing it loads no optuna (``dpfair.config.sections`` imports TuningConfig), and
every exported name resolves (the optuna-backed ones on first use)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dpfair.tuning
from dpfair import errors
from dpfair.tuning import search, worker
from tests.tuning.conftest import worker_env


def test_import_loads_neither_optuna_nor_the_accountant():
    code = (
        "import sys, dpfair.tuning\n"
        "from dpfair.tuning import TuningConfig, TuningError, BudgetExceededError\n"
        "print(sorted(m for m in ('optuna', 'mlflow', 'torch', 'dp_accounting') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=worker_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_every_exported_name_resolves():
    for name in dpfair.tuning.__all__:
        assert getattr(dpfair.tuning, name) is not None, name
    assert dpfair.tuning.tune is search.tune and dpfair.tuning.write_spec is worker.write_spec
    assert set(dpfair.tuning.__all__) <= set(dir(dpfair.tuning))
    assert dpfair.tuning.TuningError is errors.TuningError
    assert dpfair.tuning.BudgetExceededError is errors.BudgetExceededError
    with pytest.raises(AttributeError, match="no attribute 'tun'"):
        _ = dpfair.tuning.tun
