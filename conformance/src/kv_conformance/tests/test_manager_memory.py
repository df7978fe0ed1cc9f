"""Pool memory is reserved address space, committed only as slots are handed out (docs/manager.md,
"Pools"): a quota several times the machine's memory builds and stays small, the slots a cache
takes are committed before anything writes them (unless ``populate_memory`` is off), and a quota beyond
the address space raises ``HostOOMError`` with the same message on every backend, leaving
nothing mapped; the error of a level's memory or files says which level (``level``)."""

from __future__ import annotations

import ctypes
import gc
import mmap
import re
from pathlib import Path
from typing import Any

import pytest

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
)
from kv_api.constants import ceil_div
from kv_api.errors import HostOOMError

from ._manager import (
    GRAIN,
    MIB,
    active,
    fill_slot,
    make_config,
    make_manager,
    pool_group_of,
    raises_exactly,
    slot_bytes,
)

GIB = 1 << 30
TPB = 32
SLOT = 16 * 1024  # key + value of one layer: one pool whose slot divides every granularity


def config(quota: int, **kwargs: Any) -> KVCacheManagerConfig:
    layers = [AttentionLayerConfig(0, [BufferConfig("key", SLOT // 2), BufferConfig("value", SLOT // 2)])]
    return KVCacheManagerConfig(TPB, [GpuCacheTierConfig(quota)], layers, **kwargs)


def proc_kib(path: str, key: str) -> int:
    """A ``key: N kB`` line of a /proc file."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{key} not in {path}")


def rss() -> int:
    return proc_kib("/proc/self/status", "VmRSS") * 1024


def address_space() -> int:
    return proc_kib("/proc/self/status", "VmSize") * 1024


def test_a_quota_beyond_physical_memory_builds_and_stays_small(backend: kv_api.Backend) -> None:
    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "2":
        pytest.skip("strict overcommit: the kernel charges even a no-reserve mapping up front")
    quota = ceil_div(4 * proc_kib("/proc/meminfo", "MemTotal") * 1024, GIB) * GIB
    make_manager(backend, config(GRAIN))  # first-use costs (imports, caches) before measuring
    before = rss()
    manager = make_manager(backend, config(quota))
    assert manager.get_quota() == quota
    assert manager.pool_group_descs[0].num_slots == quota // SLOT
    assert rss() - before < 16 * MIB, "the pools or their bookkeeping cost memory up front"

    cache = active(manager, TPB)
    (slot,) = cache.get_base_page_indices(0)
    written = fill_slot(manager, 0, slot, 7)
    assert slot_bytes(manager, 0, slot) == written
    last = pool_group_of(manager, 0).num_slots - 1
    assert slot_bytes(manager, 0, last) == bytes(SLOT)  # never written: reads as zeros
    assert rss() - before < 16 * MIB
    cache.close()


def populate_write_works() -> bool:
    """Whether this kernel has ``MADV_POPULATE_WRITE`` (Linux 5.14)."""
    page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
    try:
        page.madvise(getattr(mmap, "MADV_POPULATE_WRITE", 23), 0, mmap.PAGESIZE)
        return True
    except OSError:
        return False
    finally:
        page.close()


def resident(memory: Any, begin: int, end: int) -> list[bool]:
    """Whether each memory page of ``memory[begin:end]`` (page-aligned) is in RAM (mincore)."""
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    pages = (end - begin) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(base + begin, end - begin, vec) == 0, ctypes.get_errno()
    return [bool(v & 1) for v in vec]


def test_the_slots_a_cache_takes_are_committed_before_they_are_written(backend: kv_api.Backend) -> None:
    """Handed out, a slot's memory is populated in 2 MiB steps (so the engine's writes and the
    tiers' copies into it take no page faults), and nothing far beyond the slots in use is."""
    if not populate_write_works():
        pytest.skip("the kernel lacks MADV_POPULATE_WRITE: pages fault in as they are written")
    manager = make_manager(backend, config(256 * MIB))
    cache = active(manager, 200 * TPB)
    assert sorted(cache.get_base_page_indices(0)) == list(range(200))
    memory = manager.pool_memory(0, 0)
    in_use = 200 * SLOT  # 3.125 MiB: committed to the next 2 MiB boundary
    assert all(resident(memory, 0, in_use))
    assert not any(resident(memory, 4 * MIB, 8 * MIB))
    assert cache.resize(300 * TPB)  # past the boundary: the next chunk
    assert all(resident(memory, 0, 300 * SLOT))
    assert not any(resident(memory, 6 * MIB, 8 * MIB))
    del memory
    cache.close()


def test_without_populate_memory_the_slots_stay_uncommitted_until_written(backend: kv_api.Backend) -> None:
    """``populate_memory=False`` (a manager whose pages nothing writes, as a replay's): the slots
    a cache takes cost no memory; a page written is committed, as any mapped memory is."""
    if not populate_write_works():
        pytest.skip("the kernel lacks MADV_POPULATE_WRITE: pages fault in as they are written")
    manager = make_manager(backend, config(256 * MIB, populate_memory=False))
    cache = active(manager, 300 * TPB)
    memory = manager.pool_memory(0, 0)
    assert not any(resident(memory, 0, 300 * SLOT))
    memory[SLOT : SLOT + 1] = b"x"
    assert resident(memory, 0, 2 * SLOT) == [False] * (SLOT // mmap.PAGESIZE) + [True] + [False] * (
        SLOT // mmap.PAGESIZE - 1
    )
    del memory
    cache.close()


def test_populate_memory_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"^KVCacheManagerConfig.populate_memory: expected a bool, got int$"):
        config(GIB, populate_memory=1)


@pytest.mark.parametrize("quota", [1 << 60, (1 << 63) - 1], ids=["2**60", "2**63-1"])
def test_a_quota_beyond_the_address_space_raises_host_oom(backend: kv_api.Backend, quota: int) -> None:
    """One pool of the whole (rounded-up) quota: 2**60 bytes, or 2**63, which no mmap takes."""
    mapped = ceil_div(quota, 32 * MIB) * (32 * MIB)
    error = raises_exactly(HostOOMError, lambda: make_manager(backend, config(quota)))
    assert str(error) == f"cannot map {mapped} bytes for a pool"
    del error
    manager = make_manager(backend, make_config())
    assert active(manager, 8).get_base_page_indices(0)


def test_a_failed_build_unmaps_the_pools_it_mapped(backend: kv_api.Backend) -> None:
    """Two pool groups: the first (a sliver of the quota, yet far beyond RAM) maps, the second
    cannot; the first is unmapped again."""
    layers = [
        AttentionLayerConfig(0, [BufferConfig("key", SLOT // 2), BufferConfig("value", SLOT // 2)]),
        AttentionLayerConfig(1, [BufferConfig("key", SLOT // 4), BufferConfig("value", SLOT // 4)], 64),
    ]
    cfg = KVCacheManagerConfig(TPB, [GpuCacheTierConfig(1 << 60)], layers, initial_pool_ratio=(1e-7, 1 - 1e-7))
    gc.collect()
    before = address_space()
    message = str(raises_exactly(HostOOMError, lambda: make_manager(backend, cfg)))
    match = re.fullmatch(r"cannot map (\d+) bytes for a pool", message)
    assert match and int(match[1]) > 1 << 59, message
    gc.collect()
    assert address_space() - before < GIB, "the first pool group's mapping (~100 GiB) was left behind"


def test_the_error_of_the_device_level_says_level_0(backend: kv_api.Backend) -> None:
    """``level`` on the error of the level whose memory failed (docs/errors.md, "Which level")."""
    device = raises_exactly(HostOOMError, lambda: make_manager(backend, config(1 << 60)))
    assert getattr(device, "level", None) == 0


@pytest.mark.requires("host_tier")
def test_the_error_of_the_host_level_says_its_level(backend: kv_api.Backend) -> None:
    """The host level's memory, when the manager is built and when a quota resize rebuilds it."""
    layers = config(GRAIN).layers
    two = KVCacheManagerConfig(TPB, [GpuCacheTierConfig(GRAIN), HostCacheTierConfig(1 << 60)], layers)
    host = raises_exactly(HostOOMError, lambda: make_manager(backend, two))
    assert getattr(host, "level", None) == 1
    small = KVCacheManagerConfig(TPB, [GpuCacheTierConfig(GRAIN), HostCacheTierConfig(GRAIN)], layers)
    manager = make_manager(backend, small)
    resized = raises_exactly(HostOOMError, lambda: manager.resize(1, 1 << 60))
    assert getattr(resized, "level", None) == 1
    assert manager.get_quota(1) == GRAIN  # nothing changed
    assert active(manager, 8).get_base_page_indices(0)


@pytest.mark.requires("disk_tier")
def test_the_error_of_a_disk_level_says_its_level(backend: kv_api.Backend, tmp_path: Path) -> None:
    """A disk level whose directory went away after the config checked it cannot make its files."""
    gone = tmp_path / "gone"
    gone.mkdir()
    tiers: list[kv_api.CacheTierConfig] = [GpuCacheTierConfig(GRAIN), DiskCacheTierConfig(GRAIN, str(gone))]
    disk = KVCacheManagerConfig(TPB, tiers, config(GRAIN).layers)
    gone.rmdir()
    with pytest.raises(OSError) as info:
        make_manager(backend, disk)
    assert getattr(info.value, "level", None) == 1 and str(gone) in str(info.value)
