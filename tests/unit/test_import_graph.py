"""The import graph of chalicelib, read from the sources (ast, nothing imported): imports
anywhere in a module count (in functions and under TYPE_CHECKING too)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "chalicelib"


def _module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path, root: Path) -> set[str]:
    """The modules under ``root`` that ``path`` imports, as absolute names."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found.add(target)
            # ``from . import x`` (or ``from pkg import x``) may import module x.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name == root.name or name.startswith(root.name + ".")}


def module_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules under root it imports}`` for every module under ``root``."""
    modules = {_module_name(path, root): path for path in root.rglob("*.py")}
    return {name: _imports(path, root) & modules.keys() - {name} for name, path in modules.items()}


def room_graph() -> dict[str, set[str]]:
    """``{room: rooms it imports}`` over chalicelib (a room: a subpackage or a top-level module)."""

    def room(module: str) -> str:  # chalicelib.storage.mempool -> storage
        return module.split(".")[1] if "." in module else module

    graph: dict[str, set[str]] = defaultdict(set)
    for module, imported in module_graph(PACKAGE).items():
        graph[room(module)].update(room(other) for other in imported if room(other) != room(module))
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A path of imports from ``start`` to ``goal``, or None."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop()
        for room in sorted(graph.get(path[-1], ())):
            if room == goal:
                return [*path, room]
            if room not in seen:
                seen.add(room)
                paths.append([*path, room])
    return None


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (the first module repeated last), or []."""
    for start in sorted(graph):
        for first in sorted(graph[start]):
            if back := _reaches(graph, first, start):
                return [start, *back]
    return []


def test_the_walk_resolves_relative_imports():
    graph = room_graph()
    assert {"clock", "protocol", "valkey"} <= graph["storage"]  # ``from ..clock import``, ...
    assert {"protocol"} == graph["valkey"]  # a top-level module's ``from .protocol.errors import``


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / "index"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import B\n")
    (package / "b.py").write_text("def f():\n    from . import a\n")
    assert cycle(module_graph(package)) == ["index.a", "index.b", "index.a"]


@pytest.mark.parametrize("package", ["index", "optimizer"])
def test_a_package_is_a_stack_without_import_cycles(package):
    graph = module_graph(PACKAGE / package)
    assert len(graph) > 3
    assert not cycle(graph), " -> ".join(cycle(graph))


def test_storage_and_stores_are_not_in_one_import_cycle():
    """Data backends (storage) and the service's Valkey stores (stores) share only the
    Valkey plumbing below them (chalicelib/valkey.py): neither reaches the other and back."""
    graph = room_graph()
    there, back = _reaches(graph, "storage", "stores"), _reaches(graph, "stores", "storage")
    assert there is None or back is None, f"{' -> '.join(there or [])} and {' -> '.join(back or [])}"


def test_control_is_the_dynamodb_control_plane_alone():
    """``control`` builds on no Valkey store and not on the composition root: its CLI
    (``python -m chalicelib.control``) builds a ControlPlane, not a Runtime."""
    assert not room_graph()["control"] & {"index", "runtime", "stores", "valkey"}
