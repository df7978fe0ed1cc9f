"""Object lifetimes: no reference leaks, and objects that outlive their owner stay usable."""

from __future__ import annotations

import gc
import sys
from typing import Any

import kv_api

from ._manager import make_config


def priority(ordinal: int, life_cycle: Any) -> int:
    return 50


def test_caches_release_their_references(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(make_config())
    callback = priority
    manager_refs, callback_refs = sys.getrefcount(manager), sys.getrefcount(callback)
    for _ in range(20):
        cache = manager.create_kv_cache(None, list(range(20)), None, callback)
        assert cache.resume() and cache.resize(24)
        cache.commit(list(range(cache.num_committed_tokens, 22)))
        cache.close()
        del cache
    gc.collect()
    assert sys.getrefcount(manager) == manager_refs
    assert sys.getrefcount(callback) == callback_refs


def test_cache_keeps_its_manager_alive(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(make_config())
    cache = manager.create_kv_cache(None, list(range(10)))
    del manager
    gc.collect()
    assert cache.resume() and cache.resize(16)
    cache.commit(list(range(10)))
    assert cache.manager.probe_reuse(None, list(range(10))) == 8  # the full blocks of tpb 4, open cache
    cache.close()


def test_dropping_an_open_cache_closes_it(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(make_config())
    cache = manager.create_kv_cache(None, list(range(10)))
    assert cache.resume() and cache.resize(12)
    cache.commit(list(range(12)))
    del cache
    gc.collect()
    assert manager.num_open_kv_caches == 0
    manager.shutdown()  # would raise LogicError if the cache were still open


def test_pool_memory_outlives_its_manager(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(make_config())
    view = manager.pool_memory(0, 0)
    del manager
    gc.collect()
    view[0:4] = b"abcd"
    assert bytes(view[0:4]) == b"abcd"
    view.release()
