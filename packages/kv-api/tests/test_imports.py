"""kv_api's modules import one another without a cycle, counting every import statement (also
those inside functions or under ``TYPE_CHECKING``): the contract is layered, not tangled."""

from __future__ import annotations

import kv_api
from kv_api._import_graph import find_cycle, import_graph


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_among_kv_api_modules() -> None:
    graph = import_graph(kv_api)
    assert graph["registry"] >= {"contract"}, "the analysis sees nothing"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
