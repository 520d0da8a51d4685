"""No circle in dpfair/data: every import between its modules, at module level or inside a
function (which runs only later), read from the source and sorted topologically."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "dpfair" / "data"
PACKAGE = "dpfair.data"


def _module(path: Path) -> str:
    return PACKAGE if path.name == "__init__.py" else f"{PACKAGE}.{path.stem}"


def _targets(node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The modules of dpfair.data one import statement loads (``from dpfair.data import x``
    loads the module ``x`` when there is one, else the package)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names} & modules
    base = PACKAGE if node.level else (node.module or "")
    if node.level and node.module:
        base = f"{PACKAGE}.{node.module}"
    named = {f"{base}.{a.name}" for a in node.names} & modules
    return named or ({base} & modules)


def import_graph() -> dict[str, set[str]]:
    """Module of dpfair.data -> the modules of dpfair.data it imports."""
    files = sorted(DATA.glob("*.py"))
    modules = {_module(p) for p in files}
    graph = {}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        graph[_module(path)] = set().union(*(_targets(n, modules) for n in nodes)) - {
            _module(path)
        }
    return graph


def test_the_reader_sees_imports_inside_functions():
    graph = import_graph()
    assert "dpfair.data.preprocess" in graph["dpfair.data.image_folder"]  # inside _csv_groups()
    assert {"dpfair.data.registry", "dpfair.data.version"} <= graph["dpfair.data.celeba"]
    assert len(graph) == len(list(DATA.glob("*.py")))


def test_no_circle_in_dpfair_data():
    try:
        order = list(TopologicalSorter(import_graph()).static_order())
    except CycleError as exc:
        raise AssertionError(f"import circle in dpfair/data: {' -> '.join(exc.args[1])}") from None
    assert order.index("dpfair.data.version") < order.index("dpfair.data.registry")
