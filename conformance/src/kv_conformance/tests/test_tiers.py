"""Host and disk tiers (docs/manager.md, "Eviction and tiers"; behaviour-spec §3 "Evictable",
"Eviction order", "Tiers and migration", "Quotas and granularity"): configs and slot counts per
level, cascade eviction (lowest priority first, FIFO within a priority, at every level; dropped
at the last), HELD pages of suspended caches (evictable above the last level, persistent at it),
onboarding on ``resume``, reuse from colder levels and ``prefetch``.

Slot counts follow from ``_tiers``' config (device 8 slots, host 4, disk 8); where each block is
comes from the events (``_tiers.Levels``), checked against what the spec's arithmetic predicts.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import kv_api
from kv_api import DiskCacheTierConfig, StorageStatistics
from kv_api.errors import InvalidStateError
from kv_api.events import Created

from ._manager import GRAIN, active, check_indices, committed, priority, raises_exactly, toks
from ._tiers import (
    DEVICE_SLOTS,
    DISK_GRAIN,
    HOST_AND_DISK,
    HOST_GRAIN,
    HOST_QUOTA,
    SLOT,
    TIER_SETS,
    TPB,
    World,
    block_hashes,
    h,
    page_levels,
    prefix,
    slots_per_level,
    tier_config,
    tier_params,
    world_state,
)
from ._tiers import (
    pages_files as open_pages_files,
)

# -- configs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kinds", tier_params())
def test_tier_layouts_are_accepted(backend: kv_api.Backend, kinds: str, tmp_path: Path) -> None:
    world = World(backend, tier_config(TIER_SETS[kinds], tmp_path))
    m = world.manager
    slots = slots_per_level(TIER_SETS[kinds])
    quotas = [GRAIN] + [HOST_QUOTA if k == "host" else DISK_GRAIN for k in TIER_SETS[kinds]]
    for level, (n, quota) in enumerate(zip(slots, quotas, strict=True)):
        assert m.get_quota(level) == quota, level
        assert m.get_storage_statistics(level) == [StorageStatistics(n, n, 0)], level
    assert world.levels.created == [Created(tuple(slots))]
    for call in (m.get_quota, m.get_storage_statistics):
        with pytest.raises(IndexError):
            call(len(slots))
    # The device level is the default.
    assert m.get_quota() == m.get_quota(0)
    assert m.get_storage_statistics() == m.get_storage_statistics(0)
    m.shutdown()


@pytest.mark.requires("host_tier")
@pytest.mark.parametrize(
    ("quota", "expected_quota"),
    [
        (HOST_QUOTA, HOST_QUOTA),
        (HOST_QUOTA + 1, HOST_QUOTA + HOST_GRAIN),  # rounded up to the 4 KiB grain
        (5 * SLOT - HOST_GRAIN, 5 * SLOT - HOST_GRAIN),  # a grain short of 5 slots
        (1, SLOT),  # below the minimum (one slot for full attention)
    ],
    ids=["exact", "plus-one", "grain-short", "minimum"],
)
def test_host_quota_granularity(backend: kv_api.Backend, quota: int, expected_quota: int) -> None:
    world = World(backend, tier_config(["host"], host=quota))
    assert world.manager.get_quota(1) == expected_quota
    slots = expected_quota // SLOT
    assert world.manager.get_storage_statistics(1) == [StorageStatistics(slots, slots, 0)]
    assert world.levels.created == [Created((DEVICE_SLOTS, slots))]


@pytest.mark.requires("disk_tier")
@pytest.mark.parametrize(
    ("quota", "expected_quota"),
    [(1, DISK_GRAIN), (DISK_GRAIN, DISK_GRAIN), (DISK_GRAIN + 1, 2 * DISK_GRAIN)],
    ids=["one-byte", "one-grain", "grain-plus-one"],
)
def test_disk_quota_granularity(backend: kv_api.Backend, quota: int, expected_quota: int, tmp_path: Path) -> None:
    world = World(backend, tier_config(["disk"], tmp_path, disk=quota))
    assert world.manager.get_quota(1) == expected_quota
    slots = expected_quota // SLOT
    assert world.manager.get_storage_statistics(1) == [StorageStatistics(slots, slots, 0)]
    world.manager.shutdown()


MULTI_POOL_LAYERS = [
    kv_api.AttentionLayerConfig(
        0, [kv_api.BufferConfig("key", 4096), kv_api.BufferConfig("value", 4096), kv_api.BufferConfig("scale", 256)]
    ),
    kv_api.AttentionLayerConfig(1, [kv_api.BufferConfig("key", 2048), kv_api.BufferConfig("value", 2048)], 8),
]


def pages_files(path: Path) -> list[Path]:
    """The open pages files in ``path`` (they have no name there), by their descriptors' links."""
    return [Path(p) for p in open_pages_files(path)]


@pytest.mark.requires("disk_tier")
def test_disk_files_live_as_long_as_the_manager(backend: kv_api.Backend, tmp_path: Path) -> None:
    """One sparse file per (pool group, pool), created at construction, removed at shutdown or
    when the manager goes away; each manager has its own."""
    quota = 64 * DISK_GRAIN
    config = tier_config(["disk"], tmp_path, disk=quota, layers=MULTI_POOL_LAYERS)
    m = backend.KVCacheManager(config)
    num_pools = sum(len(pg.pools) for pg in m.pool_group_descs)
    assert num_pools == 3  # key+value and scale for layer 0, key+value for the window layer
    files = pages_files(tmp_path)
    assert len(files) == num_pools
    assert sum(f.stat().st_blocks * 512 for f in files) < DISK_GRAIN, "the files are not sparse"
    other = backend.KVCacheManager(config)
    assert len(pages_files(tmp_path)) == 2 * num_pools
    m.shutdown()
    remaining = pages_files(tmp_path)
    assert len(remaining) == num_pools and not set(remaining) & set(files)
    m.shutdown()  # idempotent
    del other
    gc.collect()
    assert pages_files(tmp_path) == []


def test_missing_disk_path_is_refused_by_the_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"DiskCacheTierConfig\.path"):
        DiskCacheTierConfig(DISK_GRAIN, str(tmp_path / "missing"))


@pytest.mark.requires("disk_tier")
def test_disk_path_gone_before_construction(backend: kv_api.Backend, tmp_path: Path) -> None:
    """The directory existed when the config was built and is gone when the manager is: a clear
    error at construction, no file left anywhere."""
    path = tmp_path / "cache"
    path.mkdir()
    config = tier_config(["disk"], path)
    path.rmdir()
    with pytest.raises((OSError, ValueError)) as info:
        backend.KVCacheManager(config)
    assert str(path) in str(info.value)
    assert not path.exists()


# -- cascade eviction -----------------------------------------------------------------------------


def expected_level(age: int, capacities: list[int]) -> int | None:
    """Level of the prompt committed ``age`` commits ago in a FIFO pipeline of levels."""
    for level, cap in enumerate(capacities):
        if age < cap:
            return level
        age -= cap
    return None


@pytest.mark.parametrize("kinds", tier_params())
def test_cascade_moves_least_recently_released_pages_down(backend: kv_api.Backend, kinds: str, tmp_path: Path) -> None:
    """One-block prompts committed one after another, each closed at once: every level keeps
    the newest pages it can hold, each allocation evicts the oldest device page to the next level,
    which evicts its oldest in turn, and the last level drops its oldest (``Removed``)."""
    world = World(backend, tier_config(TIER_SETS[kinds], tmp_path))
    m = world.manager
    caps = slots_per_level(TIER_SETS[kinds])
    n_prompts = sum(caps) + 3
    hashes = [h(prefix(i)) for i in range(n_prompts)]
    for n in range(1, n_prompts + 1):
        committed(m, prefix(n - 1))
        step = world.step()
        assert step.stored == [hashes[n - 1]]
        expected = {i: expected_level(n - 1 - i, caps) for i in range(n)}
        before = {i: expected_level(n - 2 - i, caps) for i in range(n - 1)}
        assert sorted(step.moved) == sorted(
            (hashes[i], before[i], expected[i])
            for i in range(n - 1)
            if expected[i] is not None and before[i] != expected[i]
        ), n
        assert step.removed == [hashes[i] for i in range(n - 1) if before[i] is not None and expected[i] is None], n
        for i in range(n):
            assert world.levels.level(hashes[i]) == expected[i], (n, i)
            assert m.probe_reuse(None, prefix(i)) == (0 if expected[i] is None else TPB), (n, i)
        for level, cap in enumerate(caps):
            held = sum(1 for lv in expected.values() if lv == level)
            assert m.get_storage_statistics(level) == [StorageStatistics(cap, cap - held, held)], (n, level)
        stats = world.committed_stats()
        assert (stats.allocated_pages, stats.evicted_pages, stats.onboarded_pages) == (n, max(0, n - caps[0]), 0)
        # Every move is one page; a drop at the last level moves nothing.
        moved: dict[tuple[int, int], int] = {}
        for i in range(n):
            final = expected[i]
            deepest = len(caps) - 1 if final is None else final
            for level in range(deepest):
                moved[level, level + 1] = moved.get((level, level + 1), 0) + SLOT
        assert m.get_bytes_moved() == moved, n


@HOST_AND_DISK
def test_eviction_order_is_priority_then_fifo_at_every_level(backend: kv_api.Backend, tmp_path: Path) -> None:
    """Device 8, host 4, disk 8 slots. Pages keep their priority as they move; each level evicts
    its lowest priority first, the earliest queued there first within a priority."""
    world = World(backend, tier_config(["host", "disk"], tmp_path))
    m = world.manager
    values = [50, 10, 35, 0, 100, 20, 35, 60]
    p = [h(prefix(i)) for i in range(8)]
    q = [h(prefix(10 + i)) for i in range(8)]
    s = [h(prefix(20 + i)) for i in range(4)]
    for i, value in enumerate(values):
        committed(m, prefix(i), callback=priority(value))
    world.step()

    def at(level: int) -> set[str]:
        return {bh for (_, bh), lv in world.levels.where.items() if lv == level}

    # 4 pages: the device's lowest priorities, p2 (35) before p6 (35) as released first.
    cache = active(m, 4 * TPB)
    step = world.step()
    assert sorted(step.moved) == sorted((p[i], 0, 1) for i in (3, 1, 5, 2))
    # 2 more: p6 (35), p0 (50) fall; the host makes room with its lowest, p3 (0) and p1 (10).
    assert cache.resize(6 * TPB)
    step = world.step()
    assert sorted(step.moved) == sorted([(p[6], 0, 1), (p[0], 0, 1), (p[3], 1, 2), (p[1], 1, 2)])
    assert cache.resize(8 * TPB)
    step = world.step()
    assert sorted(step.moved) == sorted([(p[7], 0, 1), (p[4], 0, 1), (p[5], 1, 2), (p[2], 1, 2)])
    assert (at(0), at(1), at(2)) == (set(), {p[6], p[0], p[7], p[4]}, {p[3], p[1], p[5], p[2]})
    # The device holds only locked pages now: nothing to evict there.
    before = world_state(world, [cache])
    assert cache.resize(9 * TPB) is False
    assert world_state(world, [cache]) == before
    cache.close()

    # Eight priority-100 pages fill the device; evicting all of them makes the host evict its
    # four to the disk, after which the host has room for four: the last four device victims
    # stay there, the first four (the least valuable) fall on to the disk, which drops its four
    # lowest to take all eight: p3 (0), p1 (10), p5 (20), p2 (35).
    for i in range(8):
        committed(m, prefix(10 + i), callback=priority(100))
    world.step()
    cache = active(m, 8 * TPB)
    step = world.step()
    assert sorted(step.removed) == sorted(p[i] for i in (3, 1, 5, 2))
    assert sorted(step.moved) == sorted(
        [*((q[i], 0, 2) for i in range(4)), *((q[i], 0, 1) for i in range(4, 8)), *((p[i], 1, 2) for i in (6, 0, 7, 4))]
    )
    cache.close()

    # Four more pages and a full device's worth of allocation: four fall to the host, whose four
    # fall to the disk, which drops its four lowest: p6 (35), p0 (50), p7 (60), then q0 (100,
    # queued there before p4: pages falling in one call are queued by source level, warmest first).
    for i in range(4):
        committed(m, prefix(20 + i))
    world.step()
    cache = active(m, 8 * TPB)
    step = world.step()
    assert sorted(step.removed) == sorted([p[6], p[0], p[7], q[0]])
    assert sorted(step.moved) == sorted([*((q[i], 1, 2) for i in range(4, 8)), *((x, 0, 1) for x in s)])
    assert (at(0), at(1), at(2)) == (set(), set(s), {*q[1:4], p[4], *q[4:]})
    assert world.stats() == [
        [StorageStatistics(8, 0, 0)],
        [StorageStatistics(4, 0, 4)],
        [StorageStatistics(8, 0, 8)],
    ]
    assert world.committed_stats().evicted_pages == 4 + 2 + 2 + 8 + 4
    assert m.get_bytes_moved() == {(0, 1): (4 + 2 + 2 + 4 + 4) * SLOT, (0, 2): 4 * SLOT, (1, 2): (2 + 2 + 4 + 4) * SLOT}
    for i in range(8):
        assert m.probe_reuse(None, prefix(i)) == (TPB if i == 4 else 0), i
    for i in range(8):
        assert m.probe_reuse(None, prefix(10 + i)) == (0 if i == 0 else TPB), i
    cache.close()


@pytest.mark.requires("host_tier")
def test_stored_blocks_start_on_the_device(backend: kv_api.Backend) -> None:
    world = World(backend, tier_config(["host"]))
    committed(world.manager, toks(8))
    world.step()
    assert [world.levels.level(x) for x in block_hashes(toks(8))] == [0, 0]


# -- held pages -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kinds", tier_params("host", "host+disk"))
def test_held_pages_of_a_suspended_cache_move_down_and_back(
    backend: kv_api.Backend, kinds: str, tmp_path: Path
) -> None:
    world = World(backend, tier_config(TIER_SETS[kinds], tmp_path))
    m = world.manager
    held = active(m, 3 * TPB, toks(8))  # two committed blocks and an uncommitted one
    held.suspend()
    world.step()
    assert m.get_storage_statistics(0) == [StorageStatistics(8, 5, 3)]  # HELD: evictable here
    big = active(m, 8 * TPB)
    assert page_levels(held) == [1, 1, 1]
    assert list(held.get_base_page_indices(0)) == [-1] * 3
    step = world.step()
    assert sorted(step.moved) == sorted((x, 0, 1) for x in block_hashes(toks(8)))
    last = len(TIER_SETS[kinds]) == 1
    # At the host they are evictable unless the host is the last level (persistent there).
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 1, 0 if last else 3)]
    assert world.committed_stats().evicted_pages == 3
    assert m.probe_reuse(None, toks(8)) == 8
    big.close()

    assert held.resume()
    assert page_levels(held) == [0, 0, 0]
    check_indices(m, held)
    step = world.step()
    assert sorted(step.moved) == sorted((x, 1, 0) for x in block_hashes(toks(8)))
    assert world.committed_stats().onboarded_pages == 3
    assert m.get_storage_statistics(0) == [StorageStatistics(8, 5, 0)]
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 4, 0)]
    assert m.get_bytes_moved() == {(0, 1): 3 * SLOT, (1, 0): 3 * SLOT}
    held.close()


@pytest.mark.parametrize("kinds", tier_params("host", "host+disk"))
def test_held_pages_must_fit_at_the_last_level(backend: kv_api.Backend, kinds: str, tmp_path: Path) -> None:
    """With the host last, HELD pages there are persistent: once the host is full of them, a
    HELD device page has nowhere to fall and the allocation is refused, changing nothing.
    With a disk below, the host's oldest HELD page falls to the disk instead."""
    world = World(backend, tier_config(TIER_SETS[kinds], tmp_path, max_util_for_resume=1.0))
    m = world.manager
    first = active(m, 3 * TPB, toks(8))
    first.suspend()
    big = active(m, 8 * TPB)  # first's three pages fall to the host
    assert page_levels(first) == [1, 1, 1]
    big.close()
    second = active(m, 2 * TPB, toks(8, 100))
    second.suspend()
    cache = active(m, 7 * TPB)  # 6 free: one of second's pages falls into the host's last slot
    assert sorted(page_levels(second)) == [0, 1]
    assert m.get_storage_statistics(1)[0].free == 0
    world.step()
    if len(TIER_SETS[kinds]) == 1:
        before = world_state(world, [first, second, cache], [toks(8), toks(8, 100)])
        assert cache.resize(8 * TPB) is False
        assert world_state(world, [first, second, cache], [toks(8), toks(8, 100)]) == before
        assert world.step().moved == []
        # Resuming first needs 3 device slots: none free, one evictable: refused, nothing moved.
        assert first.resume() is False
        assert world_state(world, [first, second, cache], [toks(8), toks(8, 100)]) == before
        cache.close()
        assert first.resume()
        assert page_levels(first) == [0, 0, 0]
        check_indices(m, first)
    else:
        assert cache.resize(8 * TPB)
        assert page_levels(second) == [1, 1]
        # The host's first queued page (one of first's) went to the disk, persistent there.
        assert sorted(page_levels(first)) == [1, 1, 2]
        assert m.get_storage_statistics(2) == [StorageStatistics(8, 7, 0)]
        cache.close()
        assert first.resume()
        assert page_levels(first) == [0, 0, 0]
    second.close()
    first.close()


def test_one_level_keeps_held_pages(backend: kv_api.Backend) -> None:
    """The contrast: with the device tier alone a suspended cache's pages stay where they are."""
    world = World(backend, tier_config([], max_util_for_resume=1.0))
    m = world.manager
    held = active(m, 3 * TPB, toks(8))
    held.suspend()
    cache = active(m, 5 * TPB)
    assert cache.resize(6 * TPB) is False
    assert page_levels(held) == [0, 0, 0]
    assert world.committed_stats().evicted_pages == 0
    cache.close()
    held.close()


@pytest.mark.requires("host_tier")
def test_resume_makes_room_by_pushing_others_down(backend: kv_api.Backend) -> None:
    """Onboarding three host pages into a device full of evictable pages: three device victims
    fall to the host, whose only evictable page (not the cache's own, which are moving up) is
    dropped; the host then has one free slot, so the first two victims are dropped from the
    device and the third moves."""
    world = World(backend, tier_config(["host"], max_util_for_resume=1.0))
    m = world.manager
    held = active(m, 3 * TPB, toks(8))
    held.suspend()
    committed(m, prefix(0))  # lands on the device, then falls with held's pages
    big = active(m, 8 * TPB)
    assert page_levels(held) == [1, 1, 1]
    big.close()
    world.step()
    assert world.levels.level(h(prefix(0))) == 1
    d = [h(prefix(10 + i)) for i in range(8)]
    for i in range(8):
        committed(m, prefix(10 + i))
    world.step()
    assert held.resume()
    step = world.step()
    assert sorted(step.removed) == sorted([h(prefix(0)), d[0], d[1]])
    assert sorted(step.moved) == sorted([(d[2], 0, 1), *((x, 1, 0) for x in block_hashes(toks(8)))])
    assert page_levels(held) == [0, 0, 0]
    check_indices(m, held)
    assert world.stats() == [[StorageStatistics(8, 0, 5)], [StorageStatistics(4, 3, 1)]]
    held.close()


# -- reuse from colder levels --------------------------------------------------------------------------


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


# -- prefetch ---------------------------------------------------------------------------------------


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
