"""The import graph of chalicelib's packages, read from the sources (ast, nothing imported)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "chalicelib"


def _room(module: str) -> str:
    """``chalicelib.storage.mempool`` -> ``storage``; a top-level module is its own room."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def _imports(path: Path) -> set[str]:
    """The chalicelib modules ``path`` imports, absolute, TYPE_CHECKING imports included."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
    return {name for name in found if name.startswith("chalicelib.")}


def room_graph() -> dict[str, set[str]]:
    """``{room: rooms it imports}`` over chalicelib (a room: a subpackage or a top-level module)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        here = _room(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        graph[here].update(room for room in map(_room, _imports(path)) if room != here)
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


def test_the_walk_resolves_relative_imports():
    graph = room_graph()
    assert {"clock", "protocol", "valkey"} <= graph["storage"]  # ``from ..clock import``, ...
    assert {"protocol"} == graph["valkey"]  # a top-level module's ``from .protocol.errors import``


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
