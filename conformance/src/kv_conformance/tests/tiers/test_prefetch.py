"""``prefetch`` and page levels (docs/manager.md, "Eviction and tiers"): a suspended cache's
pages brought up to a level, all or nothing, room made by pushing other pages down but never the
cache's own; nothing to do where the pages already are (on a full level too) or with the device
alone; the refusals of its level argument; ``get_page_levels`` of caches with and without pages.

Slot counts follow from ``_helpers``' config (device 8 slots, host 4, disk 8).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kv_api
from kv_api import KVCacheStatus, StorageStatistics
from kv_api.errors import InvalidStateError

from .._manager import active, check_indices, committed, make_config, make_manager, raises_exactly, toks
from ._helpers import HOST_AND_DISK, TPB, World, block_hashes, h, page_levels, prefix, tier_config, world_state


@HOST_AND_DISK
def test_prefetch(backend: kv_api.Backend, tmp_path: Path) -> None:
    world = World(backend, tier_config(["host", "disk"], tmp_path))
    m = world.manager
    b = block_hashes(toks(12))
    committed(m, toks(12))
    big = active(m, 8 * TPB)  # the prompt's pages fall to the host
    big.close()
    # Eight pages fill the device; six allocations push six of them down: the host sends the
    # prompt's three to the disk and, with room for four of six, keeps the last four; the first
    # two fall on to the disk.
    d = [h(prefix(i)) for i in range(8)]
    for i in range(8):
        committed(m, prefix(i))
    world.step()
    cache = active(m, 6 * TPB)
    step = world.step()
    assert step.removed == []
    assert sorted(step.moved) == sorted(
        [*((x, 1, 2) for x in b), *((x, 0, 2) for x in d[:2]), *((x, 0, 1) for x in d[2:6])]
    )

    reader = m.create_kv_cache(None, toks(12))
    assert reader.cached_tokens_by_level == [0, 0, 12]
    assert page_levels(reader) == [2, 2, 2]
    with pytest.raises(IndexError):
        reader.prefetch(3)
    for target in (2, 2):  # nothing sits below the disk
        assert reader.prefetch(target)
    assert world.step().moved == []
    # To the host: three of its four pages make room, falling to the disk.
    assert reader.prefetch(1)
    assert page_levels(reader) == [1, 1, 1]
    step = world.step()
    assert sorted(step.moved) == sorted([*((x, 2, 1) for x in b), *((x, 1, 2) for x in d[2:5])])
    assert world.committed_stats().onboarded_pages == 0
    # To the device: two evictable pages there for three: refused, all or nothing.
    before = world_state(world, [reader, cache], [toks(12)])
    assert reader.prefetch(0) is False
    assert world_state(world, [reader, cache], [toks(12)]) == before
    cache.close()
    assert reader.prefetch(0)
    assert page_levels(reader) == [0, 0, 0]
    assert list(reader.get_base_page_indices(0)) == [-1] * 3  # still suspended, nothing locked
    assert reader.status == kv_api.KVCacheStatus.SUSPENDED
    assert sorted(world.step().moved) == sorted((x, 1, 0) for x in b)
    assert world.committed_stats().onboarded_pages == 3
    assert m.get_storage_statistics(0)[0].evictable == 2 + 3  # d6, d7 and the reader's HELD pages
    assert reader.prefetch(1)  # nothing below the host any more
    assert page_levels(reader) == [0, 0, 0]
    assert reader.resume()
    check_indices(m, reader)
    assert world.committed_stats().onboarded_pages == 3
    reader.close()


@pytest.mark.requires("host_tier")
def test_prefetch_needs_a_suspended_cache(backend: kv_api.Backend) -> None:
    world = World(backend, tier_config(["host"]))
    m = world.manager
    cache = active(m, 2 * TPB, toks(8))
    raises_exactly(InvalidStateError, cache.prefetch)
    raises_exactly(InvalidStateError, lambda: cache.prefetch(1))
    cache.close()
    raises_exactly(InvalidStateError, cache.prefetch)
    suspended = m.create_kv_cache(None, toks(8))
    assert suspended.prefetch() and suspended.prefetch(1)
    with pytest.raises(IndexError):
        suspended.prefetch(2)
    suspended.close()


def test_prefetch_level_argument_messages(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    cache = active(manager, 8, toks(6))
    cache.suspend()
    assert str(raises_exactly(ValueError, lambda: cache.prefetch(-1))) == "target_level: must be >= 0 (got -1)"
    err = raises_exactly(TypeError, lambda: cache.prefetch("0"))  # type: ignore[arg-type]
    assert str(err) == "target_level: expected an int, got str"
    assert str(raises_exactly(IndexError, lambda: cache.prefetch(1))) == "target_level 1 out of range (0..0)"
    cache.close()


@pytest.mark.requires("host_tier")
def test_prefetch_never_evicts_the_cache_own_pages(backend: kv_api.Backend) -> None:
    """Room for the pages prefetch brings up is not made by pushing down the cache's other
    pages: with the device full but for one of them, prefetch is refused and nothing moves."""
    world = World(backend, tier_config(["host"]))  # device 8 slots, host 4
    m = world.manager
    reader = active(m, 2 * TPB, toks(8))
    reader.suspend()
    other = active(m, 7 * TPB)  # one of the reader's held pages falls to the host
    assert sorted(page_levels(reader)) == [0, 1]
    assert m.get_storage_statistics(0) == [StorageStatistics(8, 0, 1)]
    before = world_state(world, [reader, other])
    assert reader.prefetch(0) is False
    assert world_state(world, [reader, other]) == before
    other.close()
    assert reader.prefetch(0)
    assert page_levels(reader) == [0, 0]
    reader.close()


def test_prefetch_to_a_full_level_where_the_pages_already_are(backend: kv_api.Backend) -> None:
    """Pages already at the target level need no room there: prefetch succeeds on a full
    device, moving nothing."""
    manager = make_manager(backend, make_config(TPB, slots=8))
    reader = active(manager, 8, toks(6))
    reader.suspend()
    other = active(manager, 6 * TPB)  # the other six slots, locked
    assert manager.get_storage_statistics() == [StorageStatistics(8, 0, 0)]  # held at the last level: kept
    assert reader.prefetch(0)
    assert reader.prefetch()
    assert list(reader.get_page_levels(0)) == [0, 0]
    assert reader.status == KVCacheStatus.SUSPENDED
    other.close()
    assert reader.resume()
    reader.close()


def test_single_level_prefetch_and_levels(backend: kv_api.Backend) -> None:
    """With the device alone everything is at level 0: prefetch has nothing to do."""
    world = World(backend, tier_config([]))
    m = world.manager
    committed(m, toks(8))
    cache = m.create_kv_cache(None, toks(8))
    assert cache.cached_tokens_by_level == [8]
    assert page_levels(cache) == [0, 0]
    assert cache.prefetch()
    with pytest.raises(IndexError):
        cache.prefetch(1)
    with pytest.raises(IndexError):
        m.get_storage_statistics(1)
    with pytest.raises(IndexError):
        m.get_quota(1)
    assert m.get_bytes_moved() == {}
    assert cache.resume()
    assert m.get_bytes_moved() == {}
    cache.close()


@pytest.mark.requires("host_tier")
def test_page_levels_of_an_unallocated_cache(backend: kv_api.Backend) -> None:
    world = World(backend, tier_config(["host"]))
    cache = active(world.manager, 3 * TPB)
    assert page_levels(cache) == [0, 0, 0]
    cache.suspend()
    assert page_levels(cache) == [0, 0, 0]
    empty = world.manager.create_kv_cache()
    assert page_levels(empty) == []
    assert empty.resume() and empty.resize(2)
    assert page_levels(empty) == [0]
    with pytest.raises(IndexError):
        cache.get_page_levels(1)
    with pytest.raises(IndexError):
        cache.get_page_levels(0, 1)
    cache.close()
    empty.close()
