"""dpfair.fairness re-exports every public name and loads pandas/scipy only when asked."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from types import ModuleType

import pytest

import dpfair.fairness as F

MODULES = ("metrics", "costs", "records", "tables", "significance")
HEAVY = ("pandas", "scipy", "mlflow", "optuna", "prefect", "dvc", "rich")


def _loaded_after(statement: str) -> list[str]:
    """Which of HEAVY a fresh interpreter has imported after running ``statement``."""
    code = f"import sys; {statement}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.parametrize("statement", [
    "import dpfair.fairness.metrics",
    "import dpfair.fairness.costs",
    "from dpfair.fairness import group_metrics, GroupMetrics",
])
def test_per_run_layer_loads_numpy_only(statement: str) -> None:
    assert _loaded_after(statement) == []


@pytest.mark.parametrize(("name", "loads"), [
    ("runs_frame", ["pandas"]),
    ("comparison_table", ["pandas"]),
    ("significance_table", ["pandas", "scipy"]),
])
def test_names_needing_pandas_load_on_first_use(name: str, loads: list[str]) -> None:
    assert _loaded_after(f"from dpfair.fairness import {name}") == loads


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_is_exported(module: str) -> None:
    mod = importlib.import_module(f"dpfair.fairness.{module}")
    public = [name for name in _defined(mod) if not name.startswith("_")]
    assert public
    for name in public:
        assert name in F.__all__, f"{module}.{name} is not exported by dpfair.fairness"
        assert getattr(F, name) is getattr(mod, name)


def _defined(module: ModuleType) -> list[str]:
    """Names a module defines at its top level (not those it imports)."""
    names = []
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def test_lazy_names_are_those_given_to_type_checkers() -> None:
    tree = ast.parse(inspect.getsource(F))
    guarded = next(n for n in tree.body if isinstance(n, ast.If))  # `if TYPE_CHECKING:`
    typed = {a.asname: n.module for n in guarded.body for a in n.names}
    assert typed == {name: f"dpfair.fairness.{m}" for name, m in F._LAZY.items()}
    with pytest.raises(AttributeError, match="no_such_name"):
        F.no_such_name  # noqa: B018
