"""Sequences that once broke a backend, kept as they were found."""

from __future__ import annotations

from pathlib import Path

import pytest

import kv_api

from ._manager import GRAIN, active, attention, check_accounting, check_page_levels, committed, make_config, toks


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
    """The differential machine's find (shown once the poison latch made a broken rule stick): a
    cache committing a full block whose tree page sat on the disk, held by a suspended cache that
    pinned the block, put its own device page in the tree's place. The holder then held an orphan,
    and once the committer closed, evicting the block's new page removed a block still pinned
    (CorruptedError). Now the tree keeps the held page and the committer holds it too."""
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
    """The lock-step walk's find (issue 22, item 1): a cache committing a block whose tree page
    sits on the host, held by a suspended cache, keeps its own device page private; once the block
    turned stale that page was kept as if its commit were pending (held, index -1, still listed),
    so pressure moved it to the host under the active cache. Now it is freed."""
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


def test_a_commit_pending_window_page_is_released_when_committing_stops(backend: kv_api.Backend) -> None:
    """The same rule's other case: a stale window page kept for a commit (history ahead of the
    committed tokens) was still kept once ``stop_committing`` made that commit impossible."""
    m = backend.KVCacheManager(make_config(layers=[attention(0, GRAIN // 8, window=8)]))
    cache = active(m, 8)
    assert cache.resize(12, 11)  # block 0 turns stale before it is committed: kept for the commit
    assert list(cache.get_page_levels(0)) == [0, 0, 0]
    check_page_levels(m, cache)
    free = m.get_storage_statistics()[0].free
    cache.stop_committing()
    assert list(cache.get_page_levels(0)) == [-1, 0, 0]
    assert m.get_storage_statistics()[0].free == free + 1
    cache.close()
    check_accounting(m, open_caches=False)
