"""Bad arguments to the manager and its caches: the same class and message from every backend,
and nothing changes."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kv_api
from kv_api import ReuseScope

from ._manager import make_config, snapshot


class Index:
    """An int-like (``__index__`` only), as the contract's ints accept."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def forged(lora_id: Any, salt: Any) -> ReuseScope:
    """A ``ReuseScope`` whose fields skipped ``__post_init__``: backends check them again at use."""
    scope = object.__new__(ReuseScope)
    object.__setattr__(scope, "lora_id", lora_id)
    object.__setattr__(scope, "salt", salt)
    return scope


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
    # None for a plain parameter meets the same checks as any other wrong type, in the documented
    # order (the native binding's signature must not refuse it first).
    ("capacity setter None", lambda m, c: setattr(c, "capacity", None)),
    ("history setter None", lambda m, c: setattr(c, "history_length", None)),
    ("layer id None", lambda m, c: m.get_layer_group_id(None)),
    ("layout layer None", lambda m, c: m.get_page_index_upper_bound(None, None)),
    ("layout role None", lambda m, c: m.get_page_stride(0, None)),
    # index_mode None is the default (PER_LAYER; required with swa_scratch_reuse: test_swa_scratch).
    ("index mode str", lambda m, c: m.get_mem_pool_base_address(0, "key", "shared")),
    ("pool group None", lambda m, c: m.pool_memory(None, 0)),
    ("level None", lambda m, c: m.get_quota(None)),
    ("layer group None", lambda m, c: c.get_base_page_indices(None)),
    ("beam None", lambda m, c: c.get_aggregated_page_indices(0, None)),
    ("buf beam None", lambda m, c: c.set_base_page_index_buf(None, 0, None)),
    # Layout calls: the layer (type, then known), then the role (type, then known).
    ("unknown layer before role type", lambda m, c: m.get_page_stride(5, 1)),
    ("layer beyond int64 before role type", lambda m, c: m.get_page_index_converter(1 << 70, 1)),
    ("unknown layer, known role", lambda m, c: m.get_mem_pool_base_address(7, "key")),
    ("role quoted by repr", lambda m, c: m.get_page_stride(0, "it's")),
    # Layer ids are int-likes, looked up (and printed) as __index__ gives them.
    ("layer id numpy unknown", lambda m, c: m.get_layer_group_id(np.int64(-1))),
    ("layer id 0-d array unknown", lambda m, c: m.get_layer_group_id(np.array(42))),
    ("layer id int-like unknown", lambda m, c: m.get_layer_group_id(Index(99))),
    ("layout layer int-like unknown", lambda m, c: m.get_page_stride(Index(3), "key")),
    # A scope built past its validation is checked again where it is used.
    ("forged scope negative lora", lambda m, c: m.probe_reuse(forged(-1, None), [1])),
    ("forged scope float salt", lambda m, c: m.create_kv_cache(forged(None, 1.5), [1])),
    ("forged scope bool lora", lambda m, c: m.probe_first_new_block_key(forged(True, None), [1])),
    ("forged scope salt 2**64", lambda m, c: m.probe_reuse(forged(1, 1 << 64), [1])),
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


def test_setters_check_the_state_before_none(backends: list[kv_api.Backend]) -> None:
    seen = set()
    for backend in backends:
        manager = backend.KVCacheManager(make_config(slots=16))
        cache = manager.create_kv_cache(None, [1, 2])  # SUSPENDED
        for name in ("capacity", "history_length"):
            result = outcome(lambda c=cache, n=name: setattr(c, n, None))
            assert result is not None and result[0] is kv_api.errors.InvalidStateError, (backend.name, result)
            seen.add(result)
    assert len(seen) == 1, seen


def test_int_likes_are_layer_ids(backends: list[kv_api.Backend]) -> None:
    for backend in backends:
        manager, _ = setup(backend)
        stride = manager.get_page_stride(0, "key")
        for layer in (np.int64(0), np.uint8(0), np.array(0), Index(0)):
            assert manager.get_layer_group_id(layer) == 0, (backend.name, layer)
            assert manager.get_page_stride(layer, "key") == stride, (backend.name, layer)
            assert manager.get_page_index_converter(layer, "key") == manager.get_page_index_converter(0, "key")


def test_a_forged_scope_with_valid_fields_reads_as_built(backends: list[kv_api.Backend]) -> None:
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]  # setup committed the first six
    for backend in backends:
        manager, _ = setup(backend)
        # The fields are converted as ReuseScope's own checks convert them (numpy ints included).
        assert manager.probe_reuse(forged(None, None), tokens) == manager.probe_reuse(ReuseScope(), tokens) > 0
        key = manager.probe_first_new_block_key(forged(np.uint64(3), Index(5)), tokens)
        assert key == manager.probe_first_new_block_key(ReuseScope(3, 5), tokens) is not None
