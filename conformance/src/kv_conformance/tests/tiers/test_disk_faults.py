"""The disk tier under faults (docs/manager.md, "Eviction and tiers"): a file system that fills
up shrinks the disk level to the slots it has, so evictions drop instead of moving down and no
request is refused for it; a page whose bytes changed on disk fails its checksum on the way up
and is a miss from then on, never data; and a pages file has no name, so a process that dies
however it dies (SIGKILL, SIGTERM, ``os._exit``) leaves nothing behind.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kv_api
from kv_api import StorageStatistics

from .._manager import MIB, active, fill_slot, slot_bytes
from ._helpers import (
    DEVICE_SLOTS,
    DISK_GRAIN,
    DISK_SLOTS,
    SMALL_FS_SLOTS,
    TPB,
    World,
    check_slot_totals,
    h,
    pages_files,
    prefix,
    tier_config,
)


def commit_prompt(world: World, i: int) -> bytes:
    """Commit the one-block ``prefix(i)``, its page filled with its own pattern."""
    cache = active(world.manager, TPB)
    (slot,) = cache.get_base_page_indices(0)
    data = fill_slot(world.manager, 0, slot, 17 + i)
    cache.commit(prefix(i))
    cache.close()
    return data


def read_back(world: World, i: int) -> bytes:
    cache = world.manager.create_kv_cache(None, prefix(i))
    assert cache.num_committed_tokens == TPB, i
    assert cache.resume()
    (slot,) = cache.get_base_page_indices(0)
    data = slot_bytes(world.manager, 0, slot)
    cache.close()
    return data


# -- a full disk -------------------------------------------------------------------------------------


@pytest.mark.requires("disk_tier")
def test_a_full_disk_drops_instead_of_moving_down(backend: kv_api.Backend, small_fs: Path) -> None:
    """A 16-slot disk tier on a file system with room for four: the eviction that needs a fifth
    disk slot finds the disk full, the level shrinks to its four slots (counted once), and every
    later eviction drops the disk's oldest page to take the device's oldest; 40 requests that
    each need an eviction all succeed, and the four newest victims come back intact."""
    world = World(backend, tier_config(["disk"], small_fs, disk=4 * MIB))
    m = world.manager
    data = {i: commit_prompt(world, i) for i in range(48)}
    stats = m.get_committed_stats()
    assert stats.disk_full_events == 1
    assert m.get_storage_statistics(1) == [StorageStatistics(SMALL_FS_SLOTS, 0, SMALL_FS_SLOTS)]
    world.step()
    assert world.levels.count(0) == DEVICE_SLOTS and world.levels.count(1) == SMALL_FS_SLOTS
    check_slot_totals(world, [0, 0])
    newest = range(48 - DEVICE_SLOTS - SMALL_FS_SLOTS, 48 - DEVICE_SLOTS)
    assert [world.levels.level(h(prefix(i))) for i in newest] == [1] * SMALL_FS_SLOTS
    # Coming up, the newest pushes the device's oldest down, which drops the disk's oldest.
    assert read_back(world, newest[-1]) == data[newest[-1]]
    world.step()
    assert world.levels.level(h(prefix(newest[0]))) is None
    check_slot_totals(world, [0, 0])
    assert m.get_committed_stats().disk_full_events == 1
    assert m.get_and_reset_iteration_stats().disk_full_events == 1
    assert m.get_and_reset_iteration_stats().disk_full_events == 0
    m.shutdown()
    assert list(small_fs.iterdir()) == []


@pytest.mark.requires("disk_tier")
def test_a_quota_resize_gives_a_shrunk_disk_its_slots_back(backend: kv_api.Backend, small_fs: Path) -> None:
    """The shrink lasts until the disk tier's quota is set again: then the level has the
    quota's slots, and the file system is asked again when pages fall there."""
    world = World(backend, tier_config(["disk"], small_fs, disk=4 * MIB))
    m = world.manager
    for i in range(DEVICE_SLOTS + SMALL_FS_SLOTS + 2):
        commit_prompt(world, i)
    assert m.get_storage_statistics(1)[0].total == SMALL_FS_SLOTS
    assert m.resize(1, 4 * MIB)
    assert m.get_storage_statistics(1)[0].total == 16
    commit_prompt(world, 100)  # the disk is still full: it shrinks again
    assert m.get_storage_statistics(1)[0].total == SMALL_FS_SLOTS
    assert m.get_committed_stats().disk_full_events == 2
    m.shutdown()


# -- pages changed on disk ---------------------------------------------------------------------------


def scribble(directory: Path, slot_size: int, slot: int) -> None:
    """Another process writing into the disk tier's file behind the manager's back."""
    (path,) = pages_files(directory)
    with open(path, "r+b") as f:
        f.seek(slot * slot_size + 1000)
        f.write(b"\xde\xad\xbe\xef")


@pytest.mark.requires("disk_tier")
def test_a_page_changed_on_disk_is_a_miss_never_data(backend: kv_api.Backend, tmp_path: Path) -> None:
    """Sixteen one-block prompts: the oldest eight fall to a 16-slot disk (slots 0..7 in
    eviction order). Bytes changed in one of their slots fail its checksum when a reader brings it up:
    the resume raises OSError (EIO) and leaves the cache suspended, the page is counted, leaves
    the tree (Removed) and the next request for that prompt misses; the other pages on the disk
    come back intact."""
    world = World(backend, tier_config(["disk"], tmp_path, disk=2 * DISK_GRAIN))  # 16 slots: room to spare
    m = world.manager
    data = {i: commit_prompt(world, i) for i in range(2 * DISK_SLOTS)}
    world.step()
    assert [world.levels.level(h(prefix(i))) for i in range(DISK_SLOTS)] == [1] * DISK_SLOTS
    slot_size = m.pool_group_descs[0].pools[0].slot_size
    scribble(tmp_path, slot_size, 3)  # prefix(3)'s page, the fourth to fall
    reader = m.create_kv_cache(None, prefix(3))
    assert reader.num_committed_tokens == TPB  # the tree does not know yet
    with pytest.raises(OSError) as info:
        reader.resume()
    assert info.value.errno == errno.EIO and str(tmp_path) in str(info.value)
    assert "checksum" in str(info.value)
    assert reader.status == kv_api.KVCacheStatus.SUSPENDED
    assert m.get_committed_stats().corrupt_pages == 1
    step = world.step()
    assert step.removed == [h(prefix(3))]
    reader.close()
    assert m.probe_reuse(None, prefix(3)) == 0
    again = m.create_kv_cache(None, prefix(3))
    assert again.num_committed_tokens == 0
    again.close()
    for i in (0, 1, 2, 4, 5, 6, 7):
        assert read_back(world, i) == data[i], i
    assert m.get_committed_stats().corrupt_pages == 1
    m.shutdown()


# -- killed processes ------------------------------------------------------------------------------

#: A child that builds a manager with a disk tier in argv[2], pushes pages to the disk, says
#: "ready", and ends by ``os._exit`` when a line comes (unless a signal ends it first).
CHILD = textwrap.dedent(
    """
    import os, sys, time
    import kv_api
    from kv_api import *
    backend = kv_api.load_backend(sys.argv[1])
    config = KVCacheManagerConfig(
        tokens_per_block=4,
        cache_tiers=[GpuCacheTierConfig(2 << 20), DiskCacheTierConfig(2 << 20, sys.argv[2])],
        layers=[AttentionLayerConfig(0, [BufferConfig("kv", 256 * 1024)])],
    )
    m = backend.KVCacheManager(config)
    for i in range(16):
        c = m.create_kv_cache(None, [])
        assert c.resume() and c.resize(4)
        c.commit([1000 * (i + 1) + t for t in range(4)])
        c.close()
    assert m.get_storage_statistics(1)[0].free == 0
    print("ready", flush=True)
    sys.stdin.readline()  # the test looks at the open files, then signals or says "exit"
    os._exit(3)
    """
)


@pytest.mark.requires("disk_tier")
@pytest.mark.parametrize("end", ["SIGKILL", "SIGTERM", "exit"])
def test_a_killed_process_leaves_no_pages_file(backend: kv_api.Backend, own_fs: Path, end: str) -> None:
    """The pages file never has a name in the directory, so the kernel frees it when the
    process ends, whatever ends it; its space comes back."""
    free_before = os.statvfs(own_fs).f_bfree
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, backend.name, str(own_fs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        line = child.stdout.readline()
        assert line == "ready\n", child.stderr.read()
        open_files = pages_files(own_fs, child.pid)
        assert open_files, "the child has no pages file open"
        assert all(os.readlink(f).endswith("(deleted)") for f in open_files)
        assert list(own_fs.iterdir()) == []
        if os.path.ismount(own_fs):
            assert os.statvfs(own_fs).f_bfree < free_before  # the child's pages take room
        if end == "exit":
            child.stdin.write("exit\n")
            child.stdin.flush()
        else:
            child.send_signal(getattr(signal, end))
        assert child.wait(timeout=30) == (3 if end == "exit" else -getattr(signal, end))
    finally:
        child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert list(own_fs.iterdir()) == []
    if os.path.ismount(own_fs):
        deadline = time.monotonic() + 10
        while os.statvfs(own_fs).f_bfree < free_before and time.monotonic() < deadline:
            time.sleep(0.05)  # the kernel frees the file once the last descriptor closes
        assert os.statvfs(own_fs).f_bfree == free_before
