"""kv_core_py's modules import one another without a cycle, counting every import statement (also
those under ``TYPE_CHECKING``), as kv_api's do: lower layers never name higher ones."""

from __future__ import annotations

import kv_core_py
from kv_api._import_graph import find_cycle, import_graph


def test_no_import_cycle_among_kv_core_py_modules() -> None:
    graph = import_graph(kv_core_py)
    assert graph["storage"] >= {"radix_tree"}, "the analysis sees nothing"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
