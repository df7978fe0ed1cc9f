"""When the disk level's blocks are allocated (docs/manager.md, "Eviction and tiers"): making
room allocates, before anything moves, the disk blocks of every slot the pages falling to the
disk will take, and none when no page falls there. The disk pool's calls are recorded through
``DiskPool.ensure_backed`` and ``DiskPool.write`` (wrapped, not replaced)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCache,
    KVCacheManagerConfig,
)
from kv_core_py import KVCacheManager
from kv_core_py.disk_pool import DiskPool

TPB = 4
SLOT = 256 * 1024
GRAIN = 2 * 1024 * 1024  # the device's 8 slots, the disk's 8


def manager(tmp_path: Path, host: bool) -> KVCacheManager:
    """Device (8 slots), optionally a host of 4 slots, then a disk of 8 slots."""
    tiers: list[Any] = [GpuCacheTierConfig(GRAIN)]
    if host:
        tiers.append(HostCacheTierConfig(4 * SLOT))
    tiers.append(DiskCacheTierConfig(GRAIN, str(tmp_path)))
    config = KVCacheManagerConfig(
        tokens_per_block=TPB, cache_tiers=tiers, layers=[AttentionLayerConfig(0, [BufferConfig("kv", SLOT)])]
    )
    return KVCacheManager(config, None)


def active(m: KVCacheManager, blocks: int, tokens: Sequence[int] = ()) -> KVCache:
    cache = m.create_kv_cache()
    assert cache.resume()
    assert cache.resize(blocks * TPB)
    if tokens:
        cache.commit(list(tokens))
    return cache


def prompt(i: int) -> list[int]:
    """One whole block, distinct per ``i``."""
    return list(range(1000 * (i + 1), 1000 * (i + 1) + TPB))


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """``("backed", num_slots)`` per ``ensure_backed`` call and ``("written", end slot)`` per
    ``write``, in call order."""
    calls: list[tuple[str, int]] = []
    real_backed, real_write = DiskPool.ensure_backed, DiskPool.write

    def ensure_backed(self: DiskPool, num_slots: int) -> None:
        calls.append(("backed", num_slots))
        real_backed(self, num_slots)

    def write(self: DiskPool, slot: int, data: memoryview) -> None:
        calls.append(("written", slot + len(data) // self.slot_size))
        real_write(self, slot, data)

    monkeypatch.setattr(DiskPool, "ensure_backed", ensure_backed)
    monkeypatch.setattr(DiskPool, "write", write)
    return calls


def unbacked_or_written(trace: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The calls that allocate blocks (slots above none) or write."""
    return [call for call in trace if call[0] == "written" or call[1] > 0]


def test_blocks_for_every_falling_page_are_allocated_before_the_first_write(
    tmp_path: Path, trace: list[tuple[str, int]]
) -> None:
    """Two committed pages in device slots 0 and 2 (slot 1 was a closed cache's) fall to the
    disk's slots 0 and 1 in one eviction: two runs, so two writes. The blocks of both disk
    slots are allocated before the first. Kills ``PoolGroup.ensure_backed__mutmut_4``
    (``+ 1`` -> ``- 1``: only the copy's own per-run allocation was left)."""
    m = manager(tmp_path, host=False)
    active(m, 1, prompt(0)).close()
    gap = active(m, 1)
    active(m, 1, prompt(1)).close()
    gap.close()
    assert trace and not unbacked_or_written(trace)  # nothing fell yet
    trace.clear()
    big = active(m, 8)  # the device's 8 slots: both committed pages fall
    assert list(m.create_kv_cache(None, prompt(0)).get_page_levels(0)) == [1]
    assert list(m.create_kv_cache(None, prompt(1)).get_page_levels(0)) == [1]
    written = [end for kind, end in trace if kind == "written"]
    assert sorted(written) == [1, 2]
    first = next(i for i, (kind, _) in enumerate(trace) if kind == "written")
    assert max(n for kind, n in trace[:first] if kind == "backed") == 2
    big.close()
    m.shutdown()


def test_no_blocks_are_allocated_while_nothing_falls_to_the_disk(tmp_path: Path, trace: list[tuple[str, int]]) -> None:
    """Two committed pages fall from the device to the host, which has room: the disk below
    gets no page, so no block is allocated there. Kills ``PoolGroup.ensure_backed__mutmut_9``
    (``default=-1`` -> ``default=+1``: two slots' blocks allocated for no page)."""
    m = manager(tmp_path, host=True)
    active(m, 2, prompt(0) + prompt(1)).close()
    big = active(m, 8)  # the device's 8 slots: both committed pages fall to the host
    assert list(m.create_kv_cache(None, prompt(0) + prompt(1)).get_page_levels(0)) == [1, 1]
    assert trace and not unbacked_or_written(trace)
    big.close()
    m.shutdown()
