"""A long prompt is a deep chain of blocks: committing, evicting, clearing and dropping it must
not recurse once per block (the native backend would overflow its stack)."""

from __future__ import annotations

import numpy as np

import kv_api

from ._manager import make_config

DEPTH = 100_000  # blocks in one chain (tokens_per_block 1)


def test_deep_chain_lives_and_dies(backend: kv_api.Backend) -> None:
    tokens = np.arange(DEPTH, dtype=np.int32)
    manager = backend.KVCacheManager(make_config(tokens_per_block=1, slots=DEPTH + 64))
    # The first block gets the lowest priority, so it is evicted first.
    cache = manager.create_kv_cache(None, [], None, lambda ordinal, life_cycle: 0 if ordinal == 0 else 50)
    assert cache.resume() and cache.resize(DEPTH)
    cache.commit(tokens)
    cache.close()
    assert manager.probe_reuse(None, tokens) == DEPTH
    # One page more than is free evicts that first block: its whole subtree, the chain, goes.
    other = manager.create_kv_cache(None, [])
    assert other.resume() and other.resize(manager.get_storage_statistics()[0].free + 1)
    assert manager.probe_reuse(None, tokens) == 0
    assert manager.get_storage_statistics()[0].evictable == 0
    other.commit(tokens[::-1][: other.capacity])
    other.close()
    manager.clear_reusable_blocks()
    assert manager.probe_reuse(None, tokens[::-1]) == 0
    cache = manager.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(DEPTH)
    cache.commit(tokens)
    cache.close()
    del cache, other, manager  # destroying a manager that still holds the chain
