"""Manager behaviour that mutation testing of the Python backend (docs/mutation.md) found
unchecked: refusal messages (pool_memory's bounds, shutdown with caches open, the base address
with scratch reuse), a quota resize that cannot fit, a back-off of exactly one block and stats
exclusion of one open cache among several. Every backend must pass them."""

from __future__ import annotations

import kv_api
from kv_api import StorageStatistics
from kv_api.errors import LogicError

from ._manager import GRAIN, active, committed, make_config, make_manager, raises_exactly, toks
from .test_cache_gaps import scratch_config

TPB = 4


def test_base_address_needs_an_index_mode_with_scratch_reuse(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(scratch_config(0), None)
    err = raises_exactly(ValueError, lambda: m.get_mem_pool_base_address(0, "key"))
    assert str(err) == "get_mem_pool_base_address: index_mode is required with swa_scratch_reuse"
    assert m.get_mem_pool_base_address(0, "key", kv_api.PageIndexMode.PER_LAYER) > 0


def test_pool_memory_bounds_are_named(backend: kv_api.Backend) -> None:
    """The first index past the end is refused with the range, like any other."""
    m = make_manager(backend, make_config(TPB, slots=8))
    assert len(m.pool_memory(0, 0)) == GRAIN
    assert str(raises_exactly(IndexError, lambda: m.pool_memory(1, 0))) == "pool_group 1 out of range (0..0)"
    assert str(raises_exactly(IndexError, lambda: m.pool_memory(0, 1))) == "pool 1 out of range (0..0)"


def test_shutdown_with_an_open_cache_names_the_call(backend: kv_api.Backend) -> None:
    m = make_manager(backend, make_config(TPB, slots=8))
    cache = active(m, 4)
    assert str(raises_exactly(LogicError, m.shutdown)) == "shutdown() with 1 KV cache(s) still open"
    cache.close()
    m.shutdown()


def test_a_quota_shrink_the_held_pages_cannot_fit_is_refused(backend: kv_api.Backend) -> None:
    """Above the minimum quota but below what a suspended cache holds at the last level:
    ``resize`` returns False and the quota and slots stay."""
    m = make_manager(backend, make_config(TPB, slots=8, quota=2 * GRAIN))  # 16 slots
    cache = active(m, 10 * TPB, toks(9 * TPB))
    cache.suspend()
    before = m.get_storage_statistics()
    assert m.resize(0, GRAIN) is False  # 8 slots for 10 held pages
    assert m.get_quota(0) == 2 * GRAIN
    assert m.get_storage_statistics() == before
    assert m.pool_group_descs[0].num_slots == 16
    cache.close()
    assert m.resize(0, GRAIN) is True  # committed pages are evicted to fit
    assert m.pool_group_descs[0].num_slots == 8


def test_a_back_off_of_exactly_the_last_block_drops_it(backend: kv_api.Backend) -> None:
    """``reuse_match_backoff`` equal to the matched tokens of the last block removes that block
    from the match: the new cache holds no page of it."""
    m = make_manager(backend, make_config(TPB, slots=8, reuse_match_backoff=TPB))
    committed(m, toks(2 * TPB))
    for n in (2 * TPB, 2 * TPB + 1):
        cache = m.create_kv_cache(None, toks(n))
        assert cache.num_reused_tokens == TPB
        assert cache.num_blocks == 1
        assert list(cache.get_page_levels(0)) == [0]
        assert m.get_storage_statistics() == [StorageStatistics(8, 6, 1)]  # the second block stays evictable
        cache.close()


def test_excluding_one_open_cache_leaves_the_others_counted(backend: kv_api.Backend) -> None:
    m = make_manager(backend, make_config(TPB, slots=16))
    a = m.create_kv_cache(None, [], 9)
    b = m.create_kv_cache(None, [], 10)
    assert a.resume() and b.resume()
    m.get_and_reset_iteration_stats()
    m.mark_stats_excluded(9)
    assert a.resize(2 * TPB) and b.resize(3 * TPB)
    assert m.get_and_reset_iteration_stats().allocated_pages == 3  # b's, not a's
    a.close()
    b.close()
