"""dpfair imports downward only (ARCHITECTURE.md draws the layers).

Layers, bottom to top: the leaves (``errors``, ``urls``, ...); ``data``, ``models``,
``accounting``, ``engine``, ``methods`` (and ``privacy``, their old paths); ``fairness``
metrics; ``training``; tuning's core, ``audit``; ``config`` and
``release`` (pure: settings, what a run releases); ``ledger``; ``tracking`` (mlflow);
``pipeline`` (mlflow, optuna, dvc); ``cli``, then ``flows`` and ``tasks`` (prefect). Checked
twice: in a fresh interpreter (what importing a module really loads, lazy circles included) and
by reading every import statement of dpfair's files (also the imports inside functions, which
run only later); no module reaches itself again through its imports.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ADAPTERS = ("mlflow", "optuna", "prefect", "dvc")
LIBRARY = (
    "dpfair.errors",
    "dpfair.metric_keys",
    "dpfair.urls",
    "dpfair.processes",  # the stop flag a training checks before each step
    "dpfair.data",
    "dpfair.models",
    "dpfair.privacy",
    "dpfair.accounting",
    "dpfair.engine",
    "dpfair.methods",
    "dpfair.engine.step",
    "dpfair.training",
    "dpfair.fairness",
    "dpfair.audit",
    "dpfair.api",
)
# The modules above the library (settings, orchestration, adapters, the user interface).
UPPER = (
    "dpfair.config",
    "dpfair.settings",
    "dpfair.tuning",
    "dpfair.release",
    "dpfair.ledger",
    "dpfair.tracking",
    "dpfair.pipeline",
    "dpfair.cli",
    "dpfair.workspace",
    "flows",
    "tasks",
)

_PROBE = """
import contextlib, importlib, io, json, sys
watched, steps = json.loads(sys.argv[1])
found = {}
for label, code in steps:
    before = set(sys.modules)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code)
    found[label] = sorted(m for m in watched if m in sys.modules and m not in before)
print(json.dumps(found))
"""


def _loaded_by(steps: list[tuple[str, str]], watched: tuple[str, ...]) -> dict[str, list[str]]:
    """Run ``steps`` (label, code) in order in a fresh interpreter; for each, the modules of
    ``watched`` it loaded first."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([watched, steps])],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _imports(modules: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(m, f"importlib.import_module({m!r})") for m in modules]


def test_library_loads_no_adapter_and_no_rich():
    loaded = _loaded_by(_imports(LIBRARY), (*ADAPTERS, "rich"))
    assert loaded == {m: [] for m in LIBRARY}


def test_config_layer_loads_no_adapter():
    modules = ("dpfair.config.params", "dpfair.tuning.config", "dpfair.settings", "dpfair.ledger")
    loaded = _loaded_by(_imports(modules), ADAPTERS)
    assert loaded == {m: [] for m in modules}


def test_data_never_reaches_up_to_the_config():
    """Loading a dataset and failing on an unknown name (the old lazy circle) stay below."""
    steps = [
        *_imports(("dpfair.data",)),
        ("load", "importlib.import_module('dpfair.data').load_dataset('synthetic', {'n': 60})"),
        ("unknown name", "from dpfair.errors import ConfigError\n"
                         "try:\n    importlib.import_module('dpfair.data').get_spec('dutc')\n"
                         "except ConfigError:\n    pass\nelse:\n    raise AssertionError"),
    ]
    loaded = _loaded_by(steps, UPPER)
    assert loaded == {label: [] for label, _ in steps}


@pytest.mark.parametrize("args", [["--help"], ["tune", "--help"], ["data", "prepare", "--help"]])
def test_cli_help_loads_neither_the_config_nor_torch(args):
    step = ("help", "from dpfair.cli.commands import app\n"
                    f"try:\n    app({args!r})\nexcept SystemExit as e:\n    assert not e.code")
    loaded = _loaded_by([step], ("torch", "dpfair.config.params", "dpfair.data", *ADAPTERS))
    assert loaded == {"help": []}


# ------------------------------------------------------------------------- import statements

DPFAIR = Path(__file__).resolve().parents[2] / "dpfair"
# Each library package (a module or a package directory) and what it must never import.
#: the private core, old paths included: data and models import none of it
CORE = ("dpfair.accounting", "dpfair.engine", "dpfair.methods", "dpfair.privacy")
BELOW = {
    "errors": ("dpfair",),
    "metric_keys": ("dpfair",),
    "urls": ("dpfair",),
    "user_cache": ("dpfair",),
    "data": (*UPPER, *CORE, "dpfair.models", "dpfair.training", "dpfair.fairness"),
    "models": (*UPPER, *CORE, "dpfair.data", "dpfair.training", "dpfair.fairness"),
    # the accountants: events in, ε out; nothing of torch's world
    "accounting": (*UPPER, "dpfair.engine", "dpfair.methods", "dpfair.privacy", "dpfair.data",
                   "dpfair.models", "dpfair.training", "dpfair.fairness"),
    # per-sample gradients and the step: it asks a method for a rule, it imports none
    "engine": (*UPPER, "dpfair.accounting", "dpfair.methods", "dpfair.privacy", "dpfair.data",
               "dpfair.models", "dpfair.training", "dpfair.fairness"),
    "methods": (*UPPER, "dpfair.privacy", "dpfair.data", "dpfair.models", "dpfair.training",
                "dpfair.fairness"),
    # only the old paths, redirected
    "privacy": (*UPPER, "dpfair.data", "dpfair.models", "dpfair.training", "dpfair.fairness"),
    "fairness": UPPER,
    "training": UPPER,
    # the privacy gate and its ledger: a database, no adapter, nothing that orchestrates
    "ledger": (*ADAPTERS, "dpfair.tracking", "dpfair.pipeline", "dpfair.cli",
               "dpfair.config.params", "flows", "tasks"),
    "workspace": ("dpfair",),
    "processes": (*UPPER, *CORE, "dpfair.data", "dpfair.models", "dpfair.training"),
    "audit": UPPER,
    # fit() is an entry point: it goes through the privacy gate, and no adapter
    "api": (*ADAPTERS, "dpfair.tracking", "dpfair.pipeline", "dpfair.cli", "dpfair.config.params",
            "flows", "tasks"),
    # the layers above the library, each a package
    "config": (*ADAPTERS, "dpfair.release", "dpfair.ledger", "dpfair.tracking", "dpfair.pipeline",
               "dpfair.cli", "flows", "tasks"),
    "release": (*ADAPTERS, "dpfair.config.params", "dpfair.ledger", "dpfair.tracking",
                "dpfair.pipeline", "dpfair.cli", "flows", "tasks"),
    "tracking": ("optuna", "prefect", "dvc", "dpfair.pipeline", "dpfair.cli", "flows", "tasks"),
    "pipeline": ("prefect", "dpfair.cli", "flows", "tasks"),
}


def _files(package: str) -> list[Path]:
    module = DPFAIR / f"{package}.py"
    return sorted([module] if module.is_file() else (DPFAIR / package).rglob("*.py"))


def _imported(source: str, package: str, *, bases: bool = True) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, as absolute names, at module
    level or inside functions; ``from pkg import name`` also yields ``pkg.name`` (and only
    that without ``bases``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            if bases:
                names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _imported_by_file(path: Path, *, bases: bool = True) -> set[str]:
    parts = path.relative_to(DPFAIR.parent).with_suffix("").parts
    package = ".".join(parts if path.name == "__init__.py" else parts[:-1])
    return _imported(path.read_text(encoding="utf-8"), package, bases=bases)


def _reaches(name: str, forbidden: tuple[str, ...]) -> bool:
    return any(name == f or name.startswith(f"{f}.") for f in forbidden)


@pytest.mark.parametrize("package", list(BELOW))
def test_library_imports_only_downward(package):
    files = _files(package)
    assert files, f"no source of dpfair.{package}"
    upward = {
        str(path.relative_to(DPFAIR.parent)): sorted(
            n for n in _imported_by_file(path) if _reaches(n, BELOW[package])
        )
        for path in files
    }
    assert {f: names for f, names in upward.items() if names} == {}


def test_dpfair_never_imports_prefect():
    """Only flows/ and tasks/ use Prefect; the CLI reaches it through flows/ when it runs one."""
    prefect = {str(path.relative_to(DPFAIR.parent)): sorted(n for n in names if
                                                          _reaches(n, ("prefect",)))
               for path in DPFAIR.rglob("*.py") if (names := _imported_by_file(path))}
    assert {f: names for f, names in prefect.items() if names} == {}


# Circles known and not broken yet; remove one when it is gone.
KNOWN_CIRCLES: list[set[str]] = []


def _module_graph() -> dict[str, set[str]]:
    """Every dpfair module (a package is its ``__init__``) and the dpfair modules it imports,
    inside functions too; ``from pkg import name`` counts as ``pkg.name`` when that is a
    module, else ``pkg`` (a submodule's own package runs first, but is no import of it)."""
    paths = {".".join(p.relative_to(DPFAIR.parent).with_suffix("").parts[
                 :-1 if p.name == "__init__.py" else None]): p for p in DPFAIR.rglob("*.py")}

    def module(name: str) -> str:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    return {name: {m for n in _imported_by_file(path, bases=False)
                   if (m := module(n)) and m != name}
            for name, path in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The sets of modules that reach each other through their imports (two or more)."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            if (node := todo.pop()) not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
        reach[start] = seen
    circles = {frozenset(n for n in reach[m] if m in reach[n]) for m in graph if m in reach[m]}
    return sorted((set(c) for c in circles), key=sorted)


def test_no_import_circle_among_dpfair_modules():
    graph = _module_graph()
    assert {"dpfair.cli.commands", "dpfair.pipeline.method_steps", "dpfair.data"} <= set(graph)
    assert [c for c in _circles(graph) if c not in KNOWN_CIRCLES] == []


def test_circle_finder_sees_a_circle_through_a_function_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [{"a", "b", "c"}]


def test_import_reader_resolves_relative_and_package_imports():
    """An upward import written as ``from .. import config`` or inside a function is seen."""
    source = "from .. import config\nfrom .options import X\ndef f():\n    import dpfair.cli\n"
    names = _imported(source, "dpfair.data")
    assert {"dpfair.config", "dpfair.data.options", "dpfair.cli"} <= names
    assert _reaches("dpfair.config", BELOW["data"]) and not _reaches("dpfair.configs", UPPER)


def test_no_library_module_is_over_500_lines():
    """Short modules, one job each (issue #13): none of dpfair/ over 500 lines."""
    root = Path(__file__).resolve().parents[2] / "dpfair"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, f"split these modules: {long}"
