"""Cascade eviction across tiers (docs/manager.md, "Eviction and tiers"; behaviour-spec §3
"Evictable", "Eviction order", "Tiers and migration"): lowest priority first, FIFO within a
priority, at every level; dropped at the last. HELD pages of suspended caches (evictable above
the last level, persistent at it), onboarding on ``resume``, and the partial tail of a cache
whose pages fell to a colder level, committed there.

Slot counts follow from ``_helpers``' config (device 8 slots, host 4, disk 8); where each block is
comes from the events (``_helpers.Levels``), checked against what the spec's arithmetic predicts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kv_api
from kv_api import StorageStatistics

from .._manager import active, check_indices, committed, priority, toks
from ._helpers import (
    HOST_AND_DISK,
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


@pytest.mark.requires("host_tier")
def test_a_partial_tail_committed_from_the_host_is_stored_at_the_host_level(backend: kv_api.Backend) -> None:
    """Closing a suspended cache whose pages fell to the host commits its partial tail there:
    the ``Stored`` event names the host level, not the device."""
    world = World(backend, tier_config(["host"]))
    m = world.manager
    reader = active(m, 2 * TPB, toks(6))
    assert world.step().stored == [h(toks(4))]
    reader.suspend()
    other = active(m, 8 * TPB)  # both held pages fall to the host
    assert page_levels(reader) == [1, 1]
    assert world.step().moved == [(h(toks(4)), 0, 1)]
    reader.close()
    assert world.step().stored == [h(toks(6))]
    assert world.levels.level(h(toks(6))) == 1
    other.close()
