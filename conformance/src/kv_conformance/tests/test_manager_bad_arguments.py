"""Bad arguments to the manager and its caches: the same class and message from every backend,
and nothing changes."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import pytest

import kv_api
from kv_api import ReuseScope

from ._manager import make_config, snapshot

CALLS: list[tuple[str, Callable[[Any, Any], object]]] = [
    ("layer id str", lambda m, c: m.get_layer_group_id("0")),
    ("layer id bool", lambda m, c: m.get_layer_group_id(True)),
    ("layer id unknown", lambda m, c: m.get_layer_group_id(99)),
    ("role int", lambda m, c: m.get_page_stride(0, 1)),
    ("role unknown", lambda m, c: m.get_page_stride(0, "nope")),
    ("layer float", lambda m, c: m.get_page_index_converter(0.0, "key")),
    ("index mode", lambda m, c: m.get_mem_pool_base_address(0, "key", 7)),
    ("pool group range", lambda m, c: m.pool_memory(5, 0)),
    ("pool range", lambda m, c: m.pool_memory(0, 9)),
    ("pool group negative", lambda m, c: m.pool_memory(-1, 0)),
    ("level 1", lambda m, c: m.get_storage_statistics(1)),
    ("level str", lambda m, c: m.get_quota("0")),
    ("scope tuple", lambda m, c: m.probe_reuse((1, 2), [1])),
    ("tokens float", lambda m, c: m.probe_reuse(None, [1.5])),
    ("id negative", lambda m, c: m.create_kv_cache(None, [1], -1)),
    ("id str", lambda m, c: m.create_kv_cache(None, [1], "x")),
    ("callback not callable", lambda m, c: m.create_kv_cache(None, [1], None, 5)),
    ("callback returns str", lambda m, c: m.create_kv_cache(None, [1, 2, 3, 4, 5], None, lambda o, lc: "x")),
    ("callback checked before tokens", lambda m, c: m.create_kv_cache(ReuseScope(1, None), [1.5], None, 5)),
    ("callback returns 101", lambda m, c: m.create_kv_cache(None, [1], None, lambda o, lc: 101).resume()),
    ("callback raises", lambda m, c: m.create_kv_cache(None, [1], None, lambda o, lc: 1 // 0).resume()),
    ("capacity str", lambda m, c: c.resize("8")),
    ("capacity negative", lambda m, c: c.resize(-1)),
    ("history bool", lambda m, c: c.resize(None, True)),
    ("history decreases", lambda m, c: c.resize(None, 2)),
    ("capacity below history", lambda m, c: c.resize(5)),
    ("commit too many", lambda m, c: c.commit(list(range(40)))),
    ("commit bad token", lambda m, c: c.commit([1, -1])),
    ("layer group range", lambda m, c: c.get_base_page_indices(3)),
    ("layer group str", lambda m, c: c.get_base_page_indices("0")),
    ("beam 1", lambda m, c: c.get_base_page_indices(0, 1)),
    ("buf bytes", lambda m, c: c.set_base_page_index_buf(0, 0, b"abcd")),
    ("buf not a buffer", lambda m, c: c.set_base_page_index_buf(0, 0, [1, 2])),
    ("buf too short", lambda m, c: c.set_base_page_index_buf(0, 0, bytearray(4))),
    # Each of the native binding's argument checkers (bindings/arguments.h) at least once.
    ("layer id beyond int64", lambda m, c: m.get_layer_group_id(1 << 70)),
    ("pool str", lambda m, c: m.pool_memory(0, "0")),
    ("pool group beyond int64", lambda m, c: m.pool_memory(1 << 70, 0)),
    ("level negative", lambda m, c: m.get_quota(-1)),
    ("level beyond int64", lambda m, c: m.get_quota(1 << 70)),
    ("id bool", lambda m, c: m.create_kv_cache(None, [1], True)),
    ("callback returns bool", lambda m, c: m.create_kv_cache(None, [1], None, lambda o, lc: True).resume()),
    ("callback returns 2**70", lambda m, c: m.create_kv_cache(None, [1], None, lambda o, lc: 1 << 70).resume()),
    ("capacity setter str", lambda m, c: setattr(c, "capacity", "8")),
    ("beam str", lambda m, c: c.get_base_page_indices(0, "0")),
    ("beam beyond int64", lambda m, c: c.get_base_page_indices(0, 1 << 70)),
    ("buf 2-D", lambda m, c: c.set_base_page_index_buf(0, 0, memoryview(bytearray(64)).cast("i", (4, 4)))),
    ("buf strided", lambda m, c: c.set_base_page_index_buf(0, 0, memoryview(array("i", [0] * 16))[::2])),
]


def outcome(call: Callable[..., object]) -> tuple[type[BaseException], str] | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the class and message are what we compare
        return type(exc), str(exc)
    return None


def setup(backend: kv_api.Backend) -> tuple[Any, Any]:
    manager = backend.KVCacheManager(make_config(slots=16))
    cache = manager.create_kv_cache(None, list(range(6)))
    assert cache.resume() and cache.resize(12, 4)
    cache.commit([1, 2, 3, 4, 5, 6])
    return manager, cache


@pytest.mark.parametrize("call", [c[1] for c in CALLS], ids=[c[0] for c in CALLS])
def test_same_error_everywhere_and_nothing_changes(
    backends: list[kv_api.Backend], call: Callable[[Any, Any], object]
) -> None:
    seen = []
    for backend in backends:
        manager, cache = setup(backend)
        before = snapshot(manager, [cache], probes=[(None, list(range(12)))])
        result = outcome(lambda m=manager, c=cache: call(m, c))
        assert result is not None, f"{backend.name}: no error"
        assert issubclass(result[0], (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError))
        # Caches created by the failing call are closed before comparing the state.
        assert snapshot(manager, [cache], probes=[(None, list(range(12)))]) == before
        seen.append((backend.name, result))
    assert len({r for _, r in seen}) == 1, seen
