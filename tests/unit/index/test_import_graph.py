"""The index package is a stack: no module imports one that (transitively) imports it,
counting imports anywhere in a module (in functions and under TYPE_CHECKING too)."""

import ast
from pathlib import Path

import chalicelib.index

INDEX_DIR = Path(chalicelib.index.__file__).parent


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module name -> the package's modules it imports (relative or absolute)."""
    modules = {p.stem for p in package_dir.glob("*.py")}
    absolute = f"chalicelib.{package_dir.name}"
    graph: dict[str, set[str]] = {}
    for name in modules:
        found: set[str] = set()
        for node in ast.walk(ast.parse((package_dir / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 1:
                    within = module
                elif node.level == 0 and (module == absolute or module.startswith(absolute + ".")):
                    within = module[len(absolute) + 1 :]
                else:
                    continue
                # ``from . import x`` imports the package and perhaps module x.
                found |= {within.split(".")[0]} if within else {"__init__", *(a.name for a in node.names)}
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(absolute + "."):
                        found.add(alias.name[len(absolute) + 1 :].split(".")[0])
        graph[name] = found & modules - {name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (module names, the first repeated last), or []."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / "index"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import B\n")
    (package / "b.py").write_text("def f():\n    from .a import A\n")
    assert cycle(import_graph(package)) == ["a", "b", "a"]


def test_the_index_package_has_no_import_cycle():
    graph = import_graph(INDEX_DIR)
    assert {"block_index", "tag_index", "sharding", "types"} <= graph.keys()
    assert not cycle(graph), " -> ".join(cycle(graph))
