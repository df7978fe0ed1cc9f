"""Copies and faults across tiers (docs/manager.md, "Eviction and tiers", "Copies"): a
``PageCopier`` sees every memory-level copy as runs of contiguous slots whose bytes add up to
``get_bytes_moved()``; a copier that raises aborts its batch (the pages stay where they were,
with their bytes), what the call did before stays done, nothing is lost or duplicated and the
manager stays usable; the disk level keeps working when its directory is removed or made
read-only (its files are open). A full disk and pages changed on disk: test_disk_faults.py.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import kv_api
from kv_api import HostMemoryCopier, PageCopier, StorageStatistics

from .._manager import MIB, active, committed, fill_slot, slot_bytes, toks
from ._helpers import (
    SLOT,
    SMALL_FS_SLOTS,
    TPB,
    World,
    check_slot_totals,
    h,
    page_levels,
    prefix,
    tier_config,
    world_state,
)


class CopyFailed(RuntimeError):
    pass


class RecordingCopier(PageCopier):
    """Records every call and delegates to ``HostMemoryCopier``; raises while ``fail`` is set
    (a copier is fixed when the manager is built, so the switch is the copier's own)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, list[tuple[int, int, int]]]] = []
        self.failed = 0
        self.fail = False
        self.inner = HostMemoryCopier()

    def copy(self, src_level: int, dst_level: int, runs: Sequence[tuple[int, int, int]]) -> None:
        if self.fail:
            self.failed += 1
            raise CopyFailed(f"copy {src_level} -> {dst_level} failed")
        self.calls.append((src_level, dst_level, list(runs)))
        self.inner.copy(src_level, dst_level, runs)

    def totals(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for src, dst, runs in self.calls:
            out[src, dst] = out.get((src, dst), 0) + sum(n for _, _, n in runs)
        return out


def device_range(world: World) -> range:
    pool = world.manager.pool_group_descs[0].pools[0]
    return range(pool.base_address, pool.base_address + world.manager.pool_group_descs[0].num_slots * pool.slot_size)


def written_prompts(world: World, indices: Sequence[int]) -> dict[int, bytes]:
    """Commit one-block ``prefix(i)`` prompts, each page filled with its own pattern."""
    data = {}
    for i in indices:
        cache = active(world.manager, TPB)
        (slot,) = cache.get_base_page_indices(0)
        data[i] = fill_slot(world.manager, 0, slot, 17 + i)
        cache.commit(prefix(i))
        cache.close()
    return data


def check_prompt(world: World, i: int, data: bytes) -> None:
    """Reuse ``prefix(i)``, resume and compare its page with what its writer left."""
    cache = world.manager.create_kv_cache(None, prefix(i))
    assert cache.num_committed_tokens == TPB, i
    assert cache.resume()
    (slot,) = cache.get_base_page_indices(0)
    assert slot_bytes(world.manager, 0, slot) == data, i
    cache.close()


# -- the copier ----------------------------------------------------------------------------------


@pytest.mark.requires("host_tier", "disk_tier")
def test_copier_sees_memory_copies_that_add_up(backend: kv_api.Backend, tmp_path: Path) -> None:
    copier = RecordingCopier()
    world = World(backend, tier_config(["host", "disk"], tmp_path), copier)
    m = world.manager
    device = device_range(world)
    data = written_prompts(world, range(3))  # device slots 0, 1, 2, queued in that order
    assert copier.calls == []
    big = active(m, 8 * TPB)  # three victims, slots 0..2, to host slots 0..2: one run
    assert len(copier.calls) == 1
    src_level, dst_level, runs = copier.calls[0]
    assert (src_level, dst_level) == (0, 1)
    assert len(runs) == 1
    src, dst, n = runs[0]
    assert (src, n) == (device.start, 3 * SLOT)
    assert dst not in device and dst + n - 1 not in device
    assert m.get_bytes_moved() == {(0, 1): 3 * SLOT}
    big.close()

    # Back up: one page each (the device's free slots come recycled, not in order).
    for i in range(3):
        check_prompt(world, i, data[i])
    assert {(s, d) for s, d, _ in copier.calls} == {(0, 1), (1, 0)}
    assert copier.totals() == m.get_bytes_moved() == {(0, 1): 3 * SLOT, (1, 0): 3 * SLOT}

    # A reused partial block is copied device -> device on the first resume.
    committed(m, toks(6))
    reader = m.create_kv_cache(None, toks(5))
    assert reader.resume()
    assert copier.calls[-1][:2] == (0, 0)
    (src, dst, n) = copier.calls[-1][2][0]
    assert src in device and dst in device and n == SLOT
    reader.close()

    # Pages falling to the disk and back: disk I/O is the manager's, the copier sees none of it.
    calls = len(copier.calls)
    for i in range(3, 11):
        committed(m, prefix(i))
    big = active(m, 8 * TPB)
    big.close()
    moved = m.get_bytes_moved()
    assert moved.get((1, 2), 0) > 0
    assert all(2 not in (s, d) for s, d, _ in copier.calls)
    assert len(copier.calls) > calls
    assert {k: v for k, v in moved.items() if 2 not in k} == copier.totals()
    for _, _, runs in copier.calls:
        spans = sorted((s, s + n) for s, _, n in runs)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), "runs overlap"
        assert all(n % SLOT == 0 and n > 0 for _, _, n in runs)


def test_page_copier_must_be_a_page_copier(backend: kv_api.Backend) -> None:
    not_a_copier: Any = HostMemoryCopier.copy
    with pytest.raises(TypeError):
        backend.KVCacheManager(tier_config([]), None, not_a_copier)
    backend.KVCacheManager(tier_config([]), None, HostMemoryCopier())


@pytest.mark.requires("host_tier")
def test_failed_copy_down_changes_nothing(backend: kv_api.Backend) -> None:
    copier = RecordingCopier()
    world = World(backend, tier_config(["host"]), copier)
    m = world.manager
    data = written_prompts(world, range(8))  # the device is full of evictable pages
    world.step()
    cache = active(m, 0)
    probes = [prefix(i) for i in range(8)]
    before = world_state(world, [cache], probes)
    copier.fail = True
    with pytest.raises(CopyFailed):
        cache.resize(2 * TPB)
    assert copier.failed == 1
    assert world_state(world, [cache], probes) == before
    step = world.step()
    assert (step.moved, step.removed) == ([], [])
    check_slot_totals(world, [0, 0])
    # The same call with a working copier.
    copier.fail = False
    assert cache.resize(2 * TPB)
    assert sorted(world.step().moved) == sorted([(h(prefix(0)), 0, 1), (h(prefix(1)), 0, 1)])
    assert world.committed_stats().evicted_pages == 2
    cache.close()
    for i in range(8):
        check_prompt(world, i, data[i])


@pytest.mark.requires("host_tier")
def test_failed_onboarding_leaves_the_cache_suspended(backend: kv_api.Backend) -> None:
    copier = RecordingCopier()
    world = World(backend, tier_config(["host"]), copier)
    m = world.manager
    held = active(m, 2 * TPB)
    data = [fill_slot(m, 0, slot, 50 + o) for o, slot in enumerate(held.get_base_page_indices(0))]
    held.commit(toks(TPB))  # block 0 committed, block 1 not
    held.suspend()
    big = active(m, 8 * TPB)
    assert page_levels(held) == [1, 1]
    big.close()
    world.step()
    before = world_state(world, [held], [toks(TPB)])
    copier.fail = True
    with pytest.raises(CopyFailed):
        held.resume()
    assert world_state(world, [held], [toks(TPB)]) == before
    assert held.status == kv_api.KVCacheStatus.SUSPENDED
    assert world.step().moved == []
    with pytest.raises(CopyFailed):
        held.prefetch(0)
    assert world_state(world, [held], [toks(TPB)]) == before
    copier.fail = False
    assert held.resume()
    assert page_levels(held) == [0, 0]
    assert world.step().moved == [(h(toks(TPB)), 1, 0)]
    assert [slot_bytes(m, 0, slot) for slot in held.get_base_page_indices(0)] == data
    assert world.committed_stats().onboarded_pages == 2
    held.close()


@pytest.mark.requires("host_tier")
def test_a_failed_copy_keeps_what_the_call_did_before(backend: kv_api.Backend) -> None:
    """The host (the last level) is full: making room drops its oldest page first, then the
    device victim's copy fails. The drop stays done, the victim stays on the device, and every
    slot is accounted for."""
    copier = RecordingCopier()
    world = World(backend, tier_config(["host"]), copier)
    m = world.manager
    data = written_prompts(world, range(12))  # 0..3 fell to the host, 4..11 on the device
    world.step()
    assert [world.levels.level(h(prefix(i))) for i in range(12)] == [1] * 4 + [0] * 8
    cache = active(m, 0)
    copier.fail = True
    with pytest.raises(CopyFailed):
        cache.resize(TPB)
    step = world.step()
    assert (step.removed, step.moved) == ([h(prefix(0))], [])
    assert world.stats() == [[StorageStatistics(8, 0, 8)], [StorageStatistics(4, 1, 3)]]
    check_slot_totals(world, [0, 0])
    assert (cache.capacity, list(cache.get_base_page_indices(0))) == (0, [])
    copier.fail = False
    assert cache.resize(TPB)
    step = world.step()
    assert (step.removed, step.moved) == ([], [(h(prefix(4)), 0, 1)])
    check_slot_totals(world, [1, 0])
    cache.close()
    for i in range(1, 12):
        check_prompt(world, i, data[i])


# -- the disk directory ------------------------------------------------------------------------------


@pytest.mark.requires("disk_tier")
@pytest.mark.parametrize("fault", ["removed", "read-only"])
def test_disk_directory_fault_mid_run(backend: kv_api.Backend, tmp_path: Path, fault: str) -> None:
    path = tmp_path / "cache"
    path.mkdir()
    world = World(backend, tier_config(["disk"], path))
    m = world.manager
    data = written_prompts(world, range(4))
    if fault == "removed":
        shutil.rmtree(path)
    else:
        path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    data.update(written_prompts(world, range(4, 12)))  # 0..3 fall to the disk
    world.step()
    assert [world.levels.level(h(prefix(i))) for i in range(12)] == [1] * 4 + [0] * 8
    for i in range(12):
        check_prompt(world, i, data[i])
    # Reading 0..3 back pushes 4..7 down, reading those pushes 8..11, and reading those 0..3.
    assert m.get_bytes_moved() == {(0, 1): 16 * SLOT, (1, 0): 12 * SLOT}
    m.shutdown()  # unlinking may fail in a read-only directory (not as root): no crash either way
    if fault == "read-only":
        path.chmod(stat.S_IRWXU)


@pytest.mark.requires("disk_tier")
def test_disk_slots_once_backed_are_reused(backend: kv_api.Backend, small_fs: Path) -> None:
    """Slots are handed out recycled first, and a recycled disk slot already has its blocks:
    after the disk's pages come back up, as many pages can fall to the disk again on the same
    small file system, without asking it for more."""
    world = World(backend, tier_config(["disk"], small_fs, disk=4 * MIB))
    m = world.manager
    data = written_prompts(world, range(8))
    for round_ in range(3):
        cache = active(m, SMALL_FS_SLOTS * TPB)  # four device victims to the disk
        world.step()
        on_disk = [i for i in range(8) if world.levels.level(h(prefix(i))) == 1]
        assert len(on_disk) == SMALL_FS_SLOTS, round_
        assert m.get_storage_statistics(1) == [StorageStatistics(16, 12, 4)], round_
        cache.close()
        for i in on_disk:  # back into the slots the cache freed: nothing falls
            check_prompt(world, i, data[i])
        world.step()
        assert m.get_storage_statistics(1) == [StorageStatistics(16, 16, 0)], round_
    m.shutdown()


@pytest.mark.requires("disk_tier")
def test_a_read_only_file_system_is_refused_at_construction(backend: kv_api.Backend, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root (not root here)")
    path = tmp_path / "ro"
    path.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {result.stderr.strip()}")
    try:
        config = tier_config(["disk"], path)
        with pytest.raises(OSError) as info:
            backend.KVCacheManager(config)
        assert str(path) in str(info.value)
        assert list(path.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
