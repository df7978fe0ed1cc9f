"""The levels of a tiered manager (docs/manager.md, "Eviction and tiers"; behaviour-spec §3 "Quotas
and granularity"): the tier layouts a config may list, each level's quota and slot counts, and the
disk level's pages files: one sparse file per pool, there as long as the manager is, never
growing past the quota.

Slot counts follow from ``_helpers``' config (device 8 slots, host 4, disk 8).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest

import kv_api
from kv_api import DiskCacheTierConfig, StorageStatistics
from kv_api.events import Created

from .._manager import GRAIN, committed
from ._helpers import (
    DEVICE_SLOTS,
    DISK_GRAIN,
    HOST_GRAIN,
    HOST_QUOTA,
    SLOT,
    TIER_SETS,
    World,
    prefix,
    slots_per_level,
    tier_config,
    tier_params,
)
from ._helpers import (
    pages_files as open_pages_files,
)


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


@pytest.mark.requires("disk_tier")
def test_a_full_disk_level_keeps_its_file_at_the_quota(backend: kv_api.Backend, tmp_path: Any) -> None:
    """Device (8 slots) and disk (8 slots): one-block prompts committed one after another fill
    the device, then the disk; from then on every eviction drops the disk's oldest page and the
    device's oldest falls into its slot. The disk blocks for arriving pages come from the free slots
    only, so the pages file never grows past the quota (pages beyond the free slots given fresh
    slot ids past the end would grow it by a slot, where a full disk would refuse them with
    DiskOOMError)."""
    manager = kv_api.create_manager(tier_config(("disk",), tmp_path), backend=backend)
    try:
        (pages,) = pages_files(tmp_path)  # the file has no name: its descriptor's link
        quota = os.stat(pages).st_size
        for i in range(2 * 8 + 4):
            committed(manager, prefix(i))
            assert os.stat(pages).st_size == quota, i
        levels = [len(manager.create_kv_cache(None, prefix(i)).get_page_levels(0)) for i in range(20)]
        assert levels == [0] * 4 + [1] * 16  # the 4 oldest dropped, 8 on the disk, 8 on the device
    finally:
        manager.shutdown()


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
