"""kv_api's modules import one another without a cycle, counting every import statement (also
those inside functions or under ``TYPE_CHECKING``): the contract is layered, not tangled."""

from __future__ import annotations

import ast
from pathlib import Path

import kv_api

PACKAGE = Path(kv_api.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py"))


def imported(module: str) -> set[str]:
    """The kv_api modules ``module`` imports (``__init__`` for names taken from the package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "kv_api":
                out.add(parts[1] if len(parts) > 1 and parts[1] in MODULES else "__init__")
    out.discard(module)
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
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


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_among_kv_api_modules() -> None:
    graph = {m: imported(m) for m in MODULES}
    assert graph["registry"] >= {"contract"}, "the analysis sees nothing"
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])
