"""Sequences that once broke a backend, kept as they were found."""

from __future__ import annotations

import kv_api

from ._manager import check_accounting, make_config


def test_evicting_a_partial_tail_another_open_cache_also_committed(backend: kv_api.Backend) -> None:
    """Two caches commit the same partial tail: the second keeps its own page (partial blocks are
    never rebased), so evicting the tree's page must not pull the block from under it."""
    manager = backend.KVCacheManager(make_config(tokens_per_block=4, slots=6))
    first = manager.create_kv_cache(None, [])
    assert first.resume() and first.resize(6)
    first.commit([1, 2, 3, 4, 5, 6], is_end=True)  # block [1..4] and the partial tail [5, 6]
    first.close()
    second = manager.create_kv_cache(None, [])
    assert second.resume() and second.resize(6)
    second.commit([1, 2, 3, 4, 5, 6], is_end=True)  # rebased onto block 0; the tail already exists
    # Take every free and evictable slot: the tree's page of the tail goes, and its block with it.
    other = manager.create_kv_cache(None, [])
    assert other.resume()
    free = manager.get_storage_statistics()[0]
    assert other.resize(4 * (free.free + free.evictable))
    assert manager.probe_reuse(None, [1, 2, 3, 4, 5, 6]) == 4
    second.close()
    other.close()
    check_accounting(manager, open_caches=False)
    assert manager.probe_reuse(None, [1, 2, 3, 4, 5, 6]) == 4  # the second cache's private tail was freed
