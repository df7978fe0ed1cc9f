"""Shared helpers for the host and disk tier tests (docs/manager.md, "Eviction and tiers").

The standard config has one full-attention layer with one buffer of ``SLOT`` = 256 KiB per block,
so every level has one pool group of one pool, and slot counts follow from the quotas by the
spec's granularities: the device's 2 MiB quota is ``DEVICE_SLOTS`` = 8 slots, a host quota of
``4 * SLOT`` (a multiple of the host's 4 KiB grain) is 4 slots, and the disk's one 2 MiB grain is
8 slots. The minimum (one slot for full attention) is below all of them.

Where each announced block is comes from the events: ``Stored`` puts it at its ``cache_level``,
``Updated(cache_level=Diff(old, new))`` moves it (``old`` must be where it was), ``Removed``
drops it. ``Levels`` keeps that model, so a test can compare it with what the spec predicts.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    CacheStats,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCache,
    KVCacheManager,
    KVCacheManagerConfig,
    PageCopier,
    StorageStatistics,
)
from kv_api.events import Created, KVCacheEvent, Removed, Stored, Updated

from .._manager import GRAIN, MIB, toks

TPB = 4
SLOT = 256 * 1024
DEVICE_SLOTS = GRAIN // SLOT  # 8
HOST_SLOTS = 4
HOST_QUOTA = HOST_SLOTS * SLOT
DISK_GRAIN = 2 * MIB
DISK_SLOTS = DISK_GRAIN // SLOT  # 8
HOST_GRAIN = 4096

#: The tier layouts tests run on: which cold tiers follow the device tier.
TIER_SETS = {
    "host": ("host",),
    "disk": ("disk",),
    "host+disk": ("host", "disk"),
}


def tier_params(*names: str) -> list[Any]:
    """``pytest.param`` per tier layout, each requiring the capabilities it uses."""
    out = []
    for name in names or tuple(TIER_SETS):
        caps = [f"{t}_tier" for t in TIER_SETS[name]]
        out.append(pytest.param(name, id=name, marks=pytest.mark.requires(*caps)))
    return out


HOST_AND_DISK = pytest.mark.requires("host_tier", "disk_tier")


def one_layer(slot: int = SLOT) -> list[AttentionLayerConfig]:
    return [AttentionLayerConfig(0, [BufferConfig("kv", slot)])]


def tiers(
    kinds: Sequence[str],
    path: Path | str | None = None,
    host: int = HOST_QUOTA,
    disk: int = DISK_GRAIN,
    device: int = GRAIN,
) -> list[Any]:
    out: list[Any] = [GpuCacheTierConfig(device)]
    for kind in kinds:
        if kind == "host":
            out.append(HostCacheTierConfig(host))
        else:
            assert path is not None, "a disk tier needs a path"
            out.append(DiskCacheTierConfig(disk, str(path)))
    return out


def tier_config(
    kinds: Sequence[str],
    path: Path | str | None = None,
    *,
    host: int = HOST_QUOTA,
    disk: int = DISK_GRAIN,
    device: int = GRAIN,
    layers: Sequence[AttentionLayerConfig] | None = None,
    **kwargs: Any,
) -> KVCacheManagerConfig:
    return KVCacheManagerConfig(
        tokens_per_block=TPB,
        cache_tiers=tiers(kinds, path, host, disk, device),
        layers=list(layers) if layers is not None else one_layer(),
        **kwargs,
    )


def slots_per_level(kinds: Sequence[str]) -> list[int]:
    """Slots of the standard config's levels."""
    return [DEVICE_SLOTS, *(HOST_SLOTS if k == "host" else DISK_SLOTS for k in kinds)]


def prefix(i: int, blocks: int = 1) -> list[int]:
    """Prompt ``i``: ``blocks`` whole blocks whose first token is distinct from every other prompt's."""
    return toks(blocks * TPB, 1000 * (i + 1))


def block_hashes(tokens: Sequence[Any], scope: kv_api.ReuseScope | None = None) -> list[str]:
    """The ``v2_sha256`` event hashes of the blocks of ``tokens`` (a partial tail included)."""
    raw = kv_api.keys.block_keys(TPB, scope, list(tokens))
    return [raw[i : i + 32].hex() for i in range(32, len(raw), 32)]


def h(tokens: Sequence[Any]) -> str:
    """The hash of the last block of ``tokens``."""
    return block_hashes(tokens)[-1]


class Levels:
    """Where each announced ``(layer group, block hash)`` is, from the events seen so far."""

    def __init__(self) -> None:
        self.where: dict[tuple[int | None, Any], int] = {}
        self.created: list[Created] = []

    def apply(self, events: Sequence[KVCacheEvent]) -> Step:
        step = Step([], [], [])
        for e in events:
            d = e.data
            if isinstance(d, Created):
                self.created.append(d)
            elif isinstance(d, Stored):
                for b in d.blocks:
                    key = (e.layer_group_id, b.block_hash)
                    assert key not in self.where, f"{key} stored twice"
                    self.where[key] = b.cache_level
                    step.stored.append(b.block_hash)
            elif isinstance(d, Removed):
                for bh in d.block_hashes:
                    key = (e.layer_group_id, bh)
                    assert key in self.where, f"{key} removed but never stored"
                    del self.where[key]
                    step.removed.append(bh)
            elif isinstance(d, Updated):
                assert d.priority is None or d.cache_level is not None
                if d.cache_level is None:
                    continue
                key = (e.layer_group_id, d.block_hash)
                assert key in self.where, f"{key} updated but never stored"
                assert self.where[key] == d.cache_level.old, (
                    f"{key} moved from level {d.cache_level.old} but was at {self.where[key]}"
                )
                assert d.cache_level.old != d.cache_level.new
                self.where[key] = d.cache_level.new
                step.moved.append((d.block_hash, d.cache_level.old, d.cache_level.new))
        return step

    def level(self, block_hash: Any, layer_group: int = 0) -> int | None:
        """The block's level, None if it is not in the tree (never stored, or removed)."""
        return self.where.get((layer_group, block_hash))

    def count(self, level: int, layer_group: int = 0) -> int:
        return sum(1 for (lg, _), lv in self.where.items() if lg == layer_group and lv == level)


@dataclass
class Step:
    """What one step's events did: hashes stored, moves ``(hash, old, new)``, hashes removed."""

    stored: list[Any]
    moved: list[tuple[Any, int, int]]
    removed: list[Any]


class World:
    """A manager with an event manager, and the levels model its events feed."""

    def __init__(
        self, backend: kv_api.Backend, config: KVCacheManagerConfig, page_copier: PageCopier | None = None
    ) -> None:
        self.events = backend.KVCacheEventManager(100_000, "v2_sha256")
        self.manager: KVCacheManager = backend.KVCacheManager(config, self.events, page_copier)
        self.levels = Levels()
        self.num_levels = len(config.cache_tiers)
        self.step()

    def step(self) -> Step:
        self.events.flush_iteration_events()
        return self.levels.apply(self.events.get_latest_events(0))

    def stats(self) -> list[list[StorageStatistics]]:
        return [self.manager.get_storage_statistics(level) for level in range(self.num_levels)]

    def committed_stats(self) -> CacheStats:
        return self.manager.get_committed_stats()


def page_levels(cache: KVCache, layer_group: int = 0) -> list[int]:
    return list(cache.get_page_levels(layer_group))


@dataclass(frozen=True)
class WorldState:
    """Everything a refused or failed call must leave as it was."""

    stats: tuple[tuple[StorageStatistics, ...], ...]
    caches: tuple[tuple[Any, ...], ...]
    probes: tuple[int, ...]
    bytes_moved: tuple[tuple[tuple[int, int], int], ...]
    counters: CacheStats


def world_state(world: World, caches: Sequence[KVCache], probes: Sequence[Sequence[Any]] = ()) -> WorldState:
    m = world.manager
    groups = len(m.life_cycles)
    return WorldState(
        tuple(tuple(s) for s in world.stats()),
        tuple(
            (
                c.status,
                c.num_committed_tokens,
                c.history_length,
                c.capacity,
                *(tuple(c.get_base_page_indices(lg)) for lg in range(groups)),
                *(tuple(c.get_page_levels(lg)) for lg in range(groups)),
            )
            for c in caches
        ),
        tuple(m.probe_reuse(None, list(p)) for p in probes),
        tuple(sorted(m.get_bytes_moved().items())),
        m.get_committed_stats(),
    )


def check_slot_totals(world: World, in_use: Sequence[int]) -> None:
    """No page lost or duplicated: at every level, with one pool group and every tree page
    announced, ``free`` plus the pages the events put there plus ``in_use[level]`` (pages no
    event describes: locked or held uncommitted ones) is ``total``."""
    for level, ((s,), extra) in enumerate(zip(world.stats(), in_use, strict=True)):
        assert s.free + world.levels.count(level) + extra == s.total, (level, s, world.levels.count(level), extra)


def pages_files(directory: Path | str, pid: int | str = "self") -> list[str]:
    """The ``/proc/PID/fd`` links of the files open in ``directory`` (a disk tier's pages files
    have no name there: their links read ``DIR/#INODE (deleted)`` or ``DIR/kvcore-... (deleted)``)."""
    fds = f"/proc/{pid}/fd"
    out = []
    for fd in sorted(os.listdir(fds), key=int):  # in the order they were opened, when none closed
        try:
            target = os.readlink(f"{fds}/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith(f"{directory}/"):
            out.append(f"{fds}/{fd}")
    return out


#: The small file system of the ``small_fs`` fixture (conftest.py) holds four 256 KiB slots and
#: 16 KiB more: never a fifth slot.
SMALL_FS_SLOTS = 4


def mount_tmpfs(path: Path, size_kib: int) -> bool:
    """A tmpfs of ``size_kib`` KiB at ``path`` (an empty directory); whether it was mounted (root
    only)."""
    if os.geteuid() != 0:
        return False
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)], capture_output=True
    )
    return result.returncode == 0
