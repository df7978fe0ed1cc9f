"""The import graph of a package's modules and a cycle in it, for the packages' layering tests."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType


def import_graph(package: ModuleType) -> dict[str, set[str]]:
    """Per module of ``package`` (a flat package), the modules of it that the module imports,
    counting every import statement (also those inside functions or under ``TYPE_CHECKING``);
    ``__init__`` stands for names taken from the package itself."""
    assert package.__file__ is not None
    root, name = Path(package.__file__).parent, package.__name__
    modules = {p.stem for p in root.glob("*.py")}

    def imported(module: str) -> set[str]:
        out: set[str] = set()
        for node in ast.walk(ast.parse((root / f"{module}.py").read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for imported_name in names:
                parts = imported_name.split(".")
                if parts[0] == name:
                    out.add(parts[1] if len(parts) > 1 and parts[1] in modules else "__init__")
        out.discard(module)
        return out

    return {m: imported(m) for m in sorted(modules)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path that starts and ends at the same module, if it has one."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            if found := visit(nxt, [*path, node]):
                return found
        done.add(node)
        return None

    return next((c for m in sorted(graph) if (c := visit(m, []))), None)
