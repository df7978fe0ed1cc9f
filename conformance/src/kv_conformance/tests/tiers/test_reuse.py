"""Reuse from colder levels (docs/manager.md, "Eviction and tiers", "Reuse"): a match found on
the host or the disk is onboarded on ``resume``, ``cached_tokens_by_level`` counts each block
where it is, ``onboarded_pages`` adds up. A block committed again by a cache while its tree page
sits on a colder level: the writer's device page takes the colder copy's place (with or without
an event manager); where a suspended cache holds that copy, the tree keeps it, and the writer's
own page stays private, freed once it is stale.

Slot counts follow from ``_helpers``' config (device 8 slots, host 4, disk 8).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kv_api
from kv_api import StorageStatistics

from .._manager import GRAIN, active, attention, check_accounting, check_indices, check_page_levels, committed, toks
from ._helpers import (
    SLOT,
    TIER_SETS,
    TPB,
    World,
    block_hashes,
    h,
    page_levels,
    prefix,
    tier_config,
    tier_params,
)


@pytest.mark.parametrize("kinds", tier_params("host", "disk"))
def test_reuse_from_a_colder_level(backend: kv_api.Backend, kinds: str, tmp_path: Path) -> None:
    world = World(backend, tier_config(TIER_SETS[kinds], tmp_path))
    m = world.manager
    committed(m, toks(12))
    big = active(m, 8 * TPB)  # 5 free slots: the prompt's three pages go down
    step = world.step()
    assert sorted(step.moved) == sorted((x, 0, 1) for x in block_hashes(toks(12)))
    assert m.probe_reuse(None, toks(12)) == 12
    assert m.probe_reuse(None, toks(10)) == 10
    big.close()
    reused = world.committed_stats().reused_tokens
    cache = m.create_kv_cache(None, [*toks(12), 99])
    assert cache.num_committed_tokens == 12
    assert cache.cached_tokens_by_level == [0, 12]
    assert page_levels(cache) == [1, 1, 1]
    assert world.committed_stats().reused_tokens == reused + 12
    assert cache.resume()
    assert page_levels(cache) == [0, 0, 0]
    check_indices(m, cache)
    assert cache.cached_tokens_by_level == [0, 12]  # where they were found, at creation
    step = world.step()
    assert sorted(step.moved) == sorted((x, 1, 0) for x in block_hashes(toks(12)))
    assert world.committed_stats().onboarded_pages == 3
    assert m.get_storage_statistics(1)[0].free == m.get_storage_statistics(1)[0].total
    assert m.get_bytes_moved() == {(0, 1): 3 * SLOT, (1, 0): 3 * SLOT}
    cache.close()


@pytest.mark.requires("host_tier")
def test_cached_tokens_by_level_counts_each_block_where_it_is(backend: kv_api.Backend) -> None:
    """A closed cache releases its pages last block first, so they are evicted in that order:
    two evictions leave block 0 on the device and blocks 1 and 2 on the host."""
    world = World(backend, tier_config(["host"]))
    m = world.manager
    committed(m, toks(12))
    cache = active(m, 7 * TPB)
    assert sorted(world.step().moved) == sorted([(h(toks(12)), 0, 1), (h(toks(8)), 0, 1)])
    whole = m.create_kv_cache(None, toks(12))
    assert whole.cached_tokens_by_level == [4, 8]
    assert page_levels(whole) == [0, 1, 1]
    whole.close()
    partial = m.create_kv_cache(None, toks(10))  # two tokens of block 2
    assert partial.cached_tokens_by_level == [4, 6]
    assert m.create_kv_cache(None, toks(3)).cached_tokens_by_level == [3, 0]
    assert m.create_kv_cache(None, [500]).cached_tokens_by_level == [0, 0]
    cache.close()
    world.step()
    # Resuming moves block 1 up and copies block 2's two tokens straight from the host into a
    # private device page: the tree's page of block 2 stays on the host.
    assert partial.resume()
    assert page_levels(partial) == [0, 0, 0]
    assert world.step().moved == [(h(toks(8)), 1, 0)]
    assert world.levels.level(h(toks(12))) == 1
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 3, 1)]
    assert m.get_bytes_moved() == {(0, 1): 2 * SLOT, (1, 0): 2 * SLOT}
    partial.close()


@pytest.mark.requires("host_tier")
def test_onboarded_pages_add_up_over_separate_moves(backend: kv_api.Backend) -> None:
    """Two prompts of two blocks fall to the host; two readers bring them back up one after the
    other: ``onboarded_pages`` counts all four, in the committed and the iteration stats (the
    second move's count adds to the first's)."""
    world = World(backend, tier_config(["host"]))
    m = world.manager
    for i in range(2):
        committed(m, prefix(i, 2))
    big = active(m, 8 * TPB)  # the device's 8 slots: all four committed pages fall to the host
    big.close()
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 0, 4)]
    m.get_and_reset_iteration_stats()
    for i in range(2):
        reader = m.create_kv_cache(None, prefix(i, 2))
        assert page_levels(reader) == [1, 1]
        assert reader.resume()
        assert page_levels(reader) == [0, 0]
        reader.close()
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 4, 0)]
    assert m.get_and_reset_iteration_stats().onboarded_pages == 4
    assert world.committed_stats().onboarded_pages == 4


# -- a block committed again while its tree page is on a colder level --------------------------


@pytest.mark.requires("host_tier")
def test_a_second_writer_takes_the_place_of_a_colder_tree_page(backend: kv_api.Backend) -> None:
    """Two caches compute the same block. The first commits it, closes, and the block's page
    falls to the host. The second, still writing on the device, commits the same tokens: its
    locked device page replaces the tree's colder copy (freed; ``Updated`` host -> device), so
    the block it pins can never be dropped from under it, and a reader finds the block on the
    device. (A kept private page here let a drop free the pinned block: a native crash.)"""
    world = World(backend, tier_config(["host"]))
    m = world.manager
    second = active(m, 2 * TPB)  # its own pages, no reuse
    first = active(m, 2 * TPB, toks(2 * TPB))
    first.close()
    world.step()
    pressure = active(m, 6 * TPB)  # the device's 8 slots: the first's two committed pages fall
    step = world.step()
    assert sorted(step.moved) == sorted((x, 0, 1) for x in block_hashes(toks(2 * TPB)))
    pressure.close()
    second.commit(toks(2 * TPB))
    step = world.step()
    assert sorted(step.moved) == sorted((x, 1, 0) for x in block_hashes(toks(2 * TPB)))
    assert step.stored == [] and step.removed == []
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 4, 0)]  # the cold copies are freed
    reader = m.create_kv_cache(None, toks(2 * TPB))
    assert reader.cached_tokens_by_level == [2 * TPB, 0]
    reader.close()
    second.close()


@pytest.mark.requires("host_tier")
def test_a_writer_takes_the_place_of_a_colder_tree_page_without_an_event_manager(backend: kv_api.Backend) -> None:
    """As ``test_a_second_writer_takes_the_place_of_a_colder_tree_page``, with no event manager:
    the writer's device page replaces the host copy (freed, and no ``Updated`` event is sent to
    the missing event manager), and a reader finds the block on the device."""
    m = backend.KVCacheManager(tier_config(["host"]), None)
    second = active(m, 2 * TPB)  # its own pages, no reuse
    committed(m, toks(2 * TPB))
    pressure = active(m, 6 * TPB)  # the device's 8 slots: the committed pages fall to the host
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 2, 2)]
    pressure.close()
    second.commit(toks(2 * TPB))
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 4, 0)]  # the cold copies are freed
    reader = m.create_kv_cache(None, toks(2 * TPB))
    assert reader.cached_tokens_by_level == [2 * TPB, 0]
    reader.close()
    second.close()
    assert m.get_storage_statistics(0) == [StorageStatistics(8, 6, 2)]


def press_until_held_page_is_on(m: kv_api.KVCacheManager, holder: kv_api.KVCache, level: int, rounds: int) -> None:
    """Commits other prompts until ``holder``'s first page has fallen to ``level`` (at most
    ``rounds`` of them); fails if it has not."""
    for k in range(1, rounds):
        if holder.get_page_levels(0)[0] == level:
            break
        committed(m, toks(8, 100 * k))
    assert list(holder.get_page_levels(0)) == [level]


@pytest.mark.requires("host_tier", "disk_tier")
def test_committing_a_block_another_cache_holds_on_a_colder_level(backend: kv_api.Backend, tmp_path: Path) -> None:
    """A cache commits a full block whose tree page sits on the disk, held by a suspended cache
    that pins the block: the tree keeps the held page, and the committer holds it too. (Its own
    device page put in the tree's place would leave the holder an orphan, and once the committer
    closed, evicting that page would remove a block still pinned: CorruptedError.)"""
    tiers: list[kv_api.CacheTierConfig] = [
        kv_api.GpuCacheTierConfig(GRAIN),
        kv_api.HostCacheTierConfig(2 * (GRAIN // 8)),
        kv_api.DiskCacheTierConfig(GRAIN, str(tmp_path)),
    ]
    config = kv_api.KVCacheManagerConfig(4, tiers, [attention(0, GRAIN // 8)], enable_partial_reuse=False)
    m = backend.KVCacheManager(config)
    committed(m, toks(4))
    holder = m.create_kv_cache(None, toks(4))  # suspended, holding and pinning block 0
    assert holder.num_reused_tokens == 4
    press_until_held_page_is_on(m, holder, 2, rounds=200)  # the disk
    writer = active(m, 4, toks(2))  # too short to reuse block 0: it computes it again
    writer.commit(toks(2, 2))
    writer.close()
    for k in range(200, 240):  # pressure again: the writer's page is gone, the tree's stays
        committed(m, toks(8, 100 * k))
    assert m.probe_reuse(None, toks(4)) == 4
    assert holder.resume()
    assert list(holder.get_page_levels(0)) == [0]
    holder.close()
    check_accounting(m, open_caches=False)


@pytest.mark.requires("host_tier")
def test_a_private_window_page_is_released_once_stale(backend: kv_api.Backend) -> None:
    """A cache committing a block whose tree page sits on the host, held by a suspended cache,
    keeps its own device page private; once the block is stale that page is freed, not kept as if
    its commit were pending (held, index -1, still listed), where pressure would move it to the
    host under the active cache."""
    window = [attention(0, GRAIN // 8, window=8)]
    tiers: list[kv_api.CacheTierConfig] = [
        kv_api.GpuCacheTierConfig(GRAIN),
        kv_api.HostCacheTierConfig(4 * (GRAIN // 8)),
    ]
    m = backend.KVCacheManager(kv_api.KVCacheManagerConfig(4, tiers, window))
    committed(m, toks(4))
    holder = m.create_kv_cache(None, toks(4))  # suspended, holding block 0's window page
    assert holder.num_reused_tokens == 4
    press_until_held_page_is_on(m, holder, 1, rounds=100)  # the host
    writer = active(m, 12, toks(2))  # too short to reuse block 0: it computes it again
    writer.commit(toks(10, 2))  # block 0 is in the tree already, and now stale
    check_page_levels(m, writer)
    assert list(writer.get_page_levels(0)) == [-1, 0, 0]
    for k in range(100, 140):  # pressure again: nothing of the writer's may leave the device
        committed(m, toks(8, 100 * k))
        check_page_levels(m, writer)
    assert m.get_storage_statistics(1)[0].free < 3  # the pressure did reach the host
    writer.close()
    assert holder.resume()
    assert list(holder.get_page_levels(0)) == [0]
    holder.close()
    check_accounting(m, open_caches=False)
