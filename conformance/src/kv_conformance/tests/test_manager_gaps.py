"""Manager behaviour that mutation testing of the Python backend (docs/mutation.md) found
unchecked: refusal messages (pool_memory's bounds, shutdown with caches open, the base address
with scratch reuse), a quota resize that cannot fit, a back-off of exactly one block and stats
exclusion of one open cache among several. Every backend must pass them."""

from __future__ import annotations

from dataclasses import replace

import pytest

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    KVCacheManagerConfig,
    StorageStatistics,
)
from kv_api.errors import LogicError

from ._manager import GRAIN, MIB, active, attention, committed, make_config, make_manager, raises_exactly, toks
from .test_cache_gaps import scratch_config

TPB = 4


@pytest.mark.requires("swa_scratch")
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


# -- the auto-tuner: adjust() after a quota resize, and a refused adjust() ------------------------

QUOTA = 32 * GRAIN
INITIAL = [1984, 128]  # the initial split of tuner_config() (as test_rebalance)
SHORT = [1344, 1408]  # the split 8-token requests call for


def tuner_config() -> kv_api.KVCacheManagerConfig:
    """Full attention plus a window of 8, an eager tuner (every sample counts, no cooldown)."""
    layers = [attention(0, 32 << 10), attention(1, 16 << 10, 8)]
    return make_config(
        TPB,
        layers=layers,
        quota=QUOTA,
        rebalance_min_sampled_kv_caches=0,
        rebalance_cooldown_secs=0,
        rebalance_target_ratio_update_interval=1,
    )


def learn_short_requests(m: kv_api.KVCacheManager) -> None:
    for _ in range(3):
        c = m.create_kv_cache()
        assert c.resume() and c.resize(8, 8)
        c.close()


def slots(m: kv_api.KVCacheManager) -> list[int]:
    return [d.num_slots for d in m.pool_group_descs]


def test_adjust_splits_the_resized_quota(backend: kv_api.Backend) -> None:
    """After a device quota resize, ``adjust`` re-splits that quota, not the configured one."""
    m = backend.KVCacheManager(tuner_config())
    assert slots(m) == INITIAL
    learn_short_requests(m)
    assert m.resize(0, QUOTA // 2)
    assert m.adjust()
    assert m.get_quota(0) == QUOTA // 2
    # As a manager configured with that quota splits it.
    half = backend.KVCacheManager(replace(tuner_config(), cache_tiers=[GpuCacheTierConfig(QUOTA // 2)]))
    learn_short_requests(half)
    assert half.adjust()
    assert slots(m) == slots(half) == [704, 640]


def test_a_refused_adjust_leaves_the_initial_split_for_later_resizes(backend: kv_api.Backend) -> None:
    """``adjust`` that cannot fit the held pages changes nothing, and a later quota resize
    still splits by the initial ratio (the tuner's split was never applied)."""
    m = backend.KVCacheManager(tuner_config())
    learn_short_requests(m)
    holder = m.create_kv_cache(None, None, 77)
    m.mark_stats_excluded(77)  # its close is no sample: the target stays
    assert holder.resume() and holder.resize(1400 * TPB, 1400 * TPB)  # 1400 full-attention pages > SHORT[0]
    holder.suspend()
    assert m.adjust() is False
    assert slots(m) == INITIAL
    holder.close()
    m.clear_reusable_blocks()
    assert m.resize(0, QUOTA)
    assert slots(m) == INITIAL
    assert m.adjust() and slots(m) == SHORT  # the target is still there to apply


@pytest.mark.requires("ssm_layers")
def test_a_match_cut_to_nothing_holds_no_block(backend: kv_api.Backend) -> None:
    """tpb 32, window 64, commit_min_snapshot, 96 then 32 more tokens committed: a prompt of the first 32 or 64
    tokens finds no window page for the block it ends in, so the match is cut to nothing and
    the new cache holds no block at all (not an empty one)."""
    kv = [BufferConfig("key", 4096), BufferConfig("value", 4096)]
    layers = [AttentionLayerConfig(0, kv), AttentionLayerConfig(1, kv, 64)]
    config = KVCacheManagerConfig(32, [GpuCacheTierConfig(8 * MIB)], layers, commit_min_snapshot=True)
    m = backend.KVCacheManager(config)
    writer = m.create_kv_cache(None, [])
    assert writer.resume() and writer.resize(128)
    writer.commit(toks(96))
    writer.commit(toks(32, 96))
    writer.close()
    free = m.get_storage_statistics()
    for n in (32, 64):
        assert m.probe_reuse(None, toks(n)) == 0
        cache = m.create_kv_cache(None, toks(n))
        assert (cache.num_reused_tokens, cache.num_blocks) == (0, 0)
        assert [list(cache.get_page_levels(lg)) for lg in (0, 1)] == [[], []]
        assert m.get_storage_statistics() == free
        cache.close()
    cache = m.create_kv_cache(None, toks(96))
    assert (cache.num_reused_tokens, cache.num_blocks) == (96, 3)
    cache.close()
