"""Quota resize of a cache level (docs/manager.md, "Eviction and tiers", "Quota resize";
behaviour-spec §2 ``resize`` and §3 "Quota resize"): every cache suspended, shrink first (room
made by eviction, then pages in the slots that go moved to free low slots), then grow, each pool
group to its own share; below the minimum quota, or when held pages cannot fit, False with
nothing changed; refusals alike on every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

import kv_api
from kv_api import StorageStatistics
from kv_api.errors import InvalidStateError

from .._manager import (
    GRAIN,
    MIB,
    active,
    attention,
    fill_slot,
    make_config,
    make_manager,
    raises_exactly,
    slot_bytes,
    toks,
)
from ._helpers import (
    HOST_QUOTA,
    SLOT,
    TPB,
    World,
    h,
    page_levels,
    pages_files,
    prefix,
    tier_config,
    world_state,
)

HOST = pytest.mark.requires("host_tier")
DISK = pytest.mark.requires("disk_tier")


def written(world: World, count: int) -> dict[int, bytes]:
    """Prompts 0..count-1 committed one block each, in that order, each page filled with its own
    bytes (written while the writer is active)."""
    m = world.manager
    data = {}
    for i in range(count):
        cache = active(m, TPB)
        (slot,) = cache.get_base_page_indices(0)
        data[i] = fill_slot(m, 0, slot, 7 + i)
        cache.commit(prefix(i))
        cache.close()
    world.step()
    return data


def read_back(world: World, i: int) -> bytes:
    """Prompt ``i``'s page bytes, read through a reader that brings it to the device."""
    m = world.manager
    reader = m.create_kv_cache(None, prefix(i))
    assert reader.num_committed_tokens == TPB, i
    assert reader.resume()
    (slot,) = reader.get_base_page_indices(0)
    out = slot_bytes(m, 0, slot)
    reader.close()
    return out


@HOST
def test_needs_every_cache_suspended_checked_before_the_arguments(backend: kv_api.Backend) -> None:
    world = World(backend, tier_config(["host"]))
    m = world.manager
    cache = active(m, TPB)
    raises_exactly(InvalidStateError, lambda: m.resize(1, HOST_QUOTA))
    raises_exactly(InvalidStateError, lambda: m.resize("x", None))  # type: ignore[arg-type]
    cache.suspend()
    assert m.resize(1, HOST_QUOTA)
    cache.close()
    m.shutdown()
    raises_exactly(InvalidStateError, lambda: m.resize(1, HOST_QUOTA))


@HOST
def test_arguments(backend: kv_api.Backend) -> None:
    m = World(backend, tier_config(["host"])).manager
    raises_exactly(IndexError, lambda: m.resize(2, HOST_QUOTA))
    raises_exactly(ValueError, lambda: m.resize(-1, HOST_QUOTA))
    raises_exactly(TypeError, lambda: m.resize(True, HOST_QUOTA))
    raises_exactly(ValueError, lambda: m.resize(1, 0))
    raises_exactly(ValueError, lambda: m.resize(1, 2**63))
    raises_exactly(TypeError, lambda: m.resize(1, 1.5))  # type: ignore[arg-type]
    raises_exactly(TypeError, lambda: m.resize(1, HOST_QUOTA, "yes"))  # type: ignore[arg-type]
    raises_exactly(NotImplementedError, lambda: m.resize(1, HOST_QUOTA, True))
    assert m.get_quota(1) == HOST_QUOTA


def test_quota_resize_refusals_read_alike(backends: list[kv_api.Backend]) -> None:
    """Every way ``resize(level, quota)`` refuses, with the class and message each backend gives
    (they must agree), and a quota of 1 byte: valid, below the minimum, so False."""
    seen = []
    for backend in backends:
        m = make_manager(backend)
        out: list[object] = []
        for args in ((0, 0), (0, "1"), (0, GRAIN, 1), (0, GRAIN, True), (1, GRAIN)):
            with pytest.raises(Exception) as info:
                m.resize(*args)
            out.append((type(info.value), str(info.value)))
        out.append(m.resize(0, 1))
        busy = [active(m, 4), active(m, 4)]
        with pytest.raises(InvalidStateError) as info:
            m.resize(0, GRAIN)
        out.append(str(info.value))
        assert "2 active" in str(info.value)
        for cache in busy:
            cache.close()
        seen.append(out)
    assert seen[0][5] is False
    assert all(s == seen[0] for s in seen)


@HOST
def test_below_the_minimum_is_false_and_changes_nothing(backend: kv_api.Backend) -> None:
    world = World(backend, tier_config(["host"]))
    m = world.manager
    written(world, 10)  # two pages on the host
    before = world_state(world, [], [prefix(i) for i in range(10)])
    # The minimum is one slot (one full-attention layer): 256 KiB, 64 host grains.
    assert m.resize(1, SLOT - 4096) is False
    assert m.resize(0, GRAIN - 1) is False  # the device's minimum is one grain
    assert world_state(world, [], [prefix(i) for i in range(10)]) == before
    assert m.get_quota(1) == HOST_QUOTA


@HOST
def test_shrink_evicts_then_moves_pages_to_low_slots(backend: kv_api.Backend) -> None:
    """Device 16 slots, full of prompts 0..15 (slot i holds prompt i). To 8 slots: eight victims
    (0..7, least recently released) fall to the 4-slot host, the last level, which keeps the
    last four and drops the first four; then prompts 8..15, in slots 8..15, move to the freed
    slots in the allocator's order (0, 1, ..., 7: dropped ones first, then moved ones)."""
    world = World(backend, tier_config(["host"], device=4 * MIB))
    m = world.manager
    data = written(world, 16)
    reader = m.create_kv_cache(None, prefix(14))  # holds prompt 14's page: HELD, still evictable here
    assert m.get_storage_statistics(0) == [StorageStatistics(16, 0, 16)]
    assert m.resize(0, 2 * MIB)
    step = world.step()
    assert sorted(step.removed) == sorted(h(prefix(i)) for i in range(4))
    assert sorted(step.moved) == sorted((h(prefix(i)), 0, 1) for i in range(4, 8))
    assert m.get_quota(0) == 2 * MIB
    assert m.get_storage_statistics(0) == [StorageStatistics(8, 0, 8)]
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 0, 4)]
    assert m.pool_group_descs[0].num_slots == 8
    assert m.get_bytes_moved() == {(0, 1): 4 * SLOT, (0, 0): 8 * SLOT}
    assert page_levels(reader) == [0]
    assert reader.resume()
    assert list(reader.get_base_page_indices(0)) == [6]  # prompt 14 moved from slot 14 to 6
    assert slot_bytes(m, 0, 6) == data[14]
    reader.close()
    assert [m.probe_reuse(None, prefix(i)) for i in range(16)] == [0] * 4 + [TPB] * 12
    for i in range(8, 16):  # on the device: reading them moves nothing
        assert read_back(world, i) == data[i], i
    assert read_back(world, 7) == data[7]  # from the host


@HOST
def test_shrink_refused_when_held_pages_cannot_fit(backend: kv_api.Backend) -> None:
    """Host is the last level: the held pages of suspended caches there are persistent."""
    world = World(backend, tier_config(["host"]))
    m = world.manager
    held = active(m, 3 * TPB)
    held.suspend()
    big = active(m, 8 * TPB)  # the held pages fall to the host
    big.close()
    assert page_levels(held) == [1, 1, 1]
    before = world_state(world, [held])
    assert m.resize(1, 2 * SLOT) is False
    assert world_state(world, [held]) == before
    assert m.resize(1, 3 * SLOT)
    assert m.get_storage_statistics(1) == [StorageStatistics(3, 0, 0)]
    assert held.resume()
    assert page_levels(held) == [0, 0, 0]
    held.close()


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


@HOST
def test_grow_then_more_pages_stay(backend: kv_api.Backend) -> None:
    world = World(backend, tier_config(["host"]))
    m = world.manager
    data = written(world, 12)  # four on the host
    assert m.resize(1, 8 * SLOT)
    assert m.get_storage_statistics(1) == [StorageStatistics(8, 4, 4)]
    assert m.get_quota(1) == 8 * SLOT
    world.step()
    cache = active(m, 4 * TPB)  # four device victims: the host takes them without dropping
    step = world.step()
    assert step.removed == []
    assert sorted(step.moved) == sorted((h(prefix(i)), 0, 1) for i in range(4, 8))
    assert m.get_storage_statistics(1) == [StorageStatistics(8, 0, 8)]
    cache.close()
    assert [m.probe_reuse(None, prefix(i)) for i in range(12)] == [TPB] * 12
    assert read_back(world, 0) == data[0]  # the oldest host page, through the new mapping


@pytest.mark.requires("host_tier")
def test_quota_resize_changes_a_later_pool_group_alone(backend: kv_api.Backend) -> None:
    """Two pool groups (slot sizes 256 and 128 KiB) split a host quota by ratio; a new quota
    may leave the first group's slot count as it is and change only the second's, which must
    still be resized (a loop that stopped at the first unchanged group would not)."""
    layers = [attention(0, 256 << 10), attention(1, 128 << 10, 8)]
    config = kv_api.KVCacheManagerConfig(
        tokens_per_block=4,
        cache_tiers=[kv_api.GpuCacheTierConfig(GRAIN), kv_api.HostCacheTierConfig(GRAIN)],
        layers=layers,
        initial_pool_ratio=[0.5, 0.5],
    )
    m = backend.KVCacheManager(config)
    before = [s.total for s in m.get_storage_statistics(1)]
    changed = None
    for quota in range(GRAIN - 32 * 4096, GRAIN + 64 * 4096, 4096):
        assert m.resize(1, quota)
        now = [s.total for s in m.get_storage_statistics(1)]
        if now[0] == before[0] and now[1] != before[1]:
            changed = quota
            break
        before = now
    assert changed is not None, "no quota changed the second group alone"
    assert m.get_quota(1) == changed


@HOST
def test_device_views_taken_before_stay_readable(backend: kv_api.Backend) -> None:
    """The device's pools are remapped: a view taken before reads the old memory safely, a new
    view sees the pages."""
    world = World(backend, tier_config(["host"], device=4 * MIB))
    m = world.manager
    old = m.pool_memory(0, 0)
    data = written(world, 4)
    assert m.resize(0, 8 * MIB)
    assert len(old) == 16 * SLOT
    assert bytes(old[:4]) == data[0][:4]
    new = m.pool_memory(0, 0)
    assert len(new) == 32 * SLOT
    for i in range(4):
        assert read_back(world, i) == data[i]


@DISK
def test_disk_file_follows_the_quota(backend: kv_api.Backend, tmp_path: Path) -> None:
    world = World(backend, tier_config(["disk"], tmp_path, disk=4 * MIB))
    m = world.manager
    assert list(tmp_path.iterdir()) == []  # the file has no name: its descriptor's link
    (file,) = (Path(p) for p in pages_files(tmp_path))
    assert file.stat().st_size == 4 * MIB
    data = written(world, 12)  # four on the disk, in its slots 0..3
    assert m.resize(1, 2 * MIB)
    assert file.stat().st_size == 2 * MIB
    assert m.get_storage_statistics(1) == [StorageStatistics(8, 4, 4)]
    assert m.resize(1, 6 * MIB)
    assert file.stat().st_size == 6 * MIB
    for i in range(12):
        assert read_back(world, i) == data[i], i
    m.shutdown()
    assert list(tmp_path.iterdir()) == []


@DISK
def test_disk_shrink_moves_pages_within_the_file(backend: kv_api.Backend, tmp_path: Path) -> None:
    """Device 8 slots, disk 16: prompts 0..19 leave 0..11 on the disk, in its slots 0..11. To 8
    disk slots: the four free ones are not enough, so the four least recent (0..3, slots 0..3)
    drop, and prompts 8..11 move from slots 8..11 to 0..3, copied within the file: each reads back
    its own bytes (reading one brings it to the device, whose oldest page takes its disk slot)."""
    world = World(backend, tier_config(["disk"], tmp_path, disk=4 * MIB))
    m = world.manager
    data = written(world, 20)
    assert m.get_storage_statistics(1) == [StorageStatistics(16, 4, 12)]
    assert m.resize(1, 2 * MIB)
    step = world.step()
    assert sorted(step.removed) == sorted(h(prefix(i)) for i in range(4))
    assert m.get_storage_statistics(1) == [StorageStatistics(8, 0, 8)]
    assert m.get_bytes_moved()[(1, 1)] == 4 * SLOT
    assert [m.probe_reuse(None, prefix(i)) for i in range(20)] == [0] * 4 + [TPB] * 16
    for i in range(8, 12):
        assert read_back(world, i) == data[i], i
