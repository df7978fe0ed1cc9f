"""One cache level (device, host or disk): its pool groups, each with a slot allocator, pools of
real memory (or disk) and an eviction queue (docs/manager.md, "Eviction and tiers")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kv_api.config import DiskCacheTierConfig, KVCacheManagerConfig
from kv_api.errors import OutOfMemoryError
from kv_api.stats import StorageStatistics
from kv_core_py.disk_pool import DiskPool
from kv_core_py.eviction import EvictionQueue
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.memory_pool import MemoryPool
from kv_core_py.slot_allocator import SlotAllocator
from kv_core_py.slot_counts import SlotCounts
from kv_core_py.storage_config import StorageConfig


class PoolGroup:
    def __init__(
        self, index: int, slot_sizes: tuple[int, ...], num_slots: int, directory: str | None, populating: bool = True
    ) -> None:
        self.index = index
        self.populating = populating  # config.populate_memory
        self.allocator = SlotAllocator(num_slots)
        self.evictable = EvictionQueue()
        self.pools: list[MemoryPool] = []
        self.disk_pools: list[DiskPool] = []
        try:
            for size in slot_sizes:
                if directory is None:
                    self.pools.append(MemoryPool(num_slots, size))
                else:
                    self.disk_pools.append(DiskPool(num_slots, size, directory))
        except BaseException:
            self.close()
            raise

    @property
    def num_slots(self) -> int:
        return self.allocator.num_slots

    @property
    def slot_bytes(self) -> int:
        """Bytes of one page: its slot in every pool."""
        return sum(p.slot_size for p in self.pools) + sum(p.slot_size for p in self.disk_pools)

    @property
    def on_disk(self) -> bool:
        return bool(self.disk_pools)

    def statistics(self) -> StorageStatistics:
        return StorageStatistics(self.num_slots, self.allocator.num_free, len(self.evictable))

    def utilization(self) -> float:
        stats = self.statistics()
        return stats.unavailable / stats.total if stats.total else 0.0

    def allocate(self, n: int) -> list[int]:
        """``n`` slot ids (the allocator's), the memory below every fresh one committed."""
        slots = self.allocator.allocate(n)
        self.populate(self.allocator.next_fresh)
        return slots

    def populate(self, end: int) -> None:
        """Commit the memory pools' bytes of the slots below ``end`` (``MemoryPool.populate``):
        before anything is copied or written into them. Not where ``populate_memory`` is off."""
        if not self.populating:
            return
        for pool in self.pools:
            pool.populate(end * pool.slot_size)

    def new_memory(self, num_slots: int) -> list[MemoryPool]:
        """The pools a resize to ``num_slots`` maps (a host refusal raises before anything changes)."""
        return [MemoryPool(num_slots, pool.slot_size) for pool in self.pools]

    def remap(self, num_slots: int, memory: list[MemoryPool], occupied: list[int]) -> None:
        """Take ``memory`` (from ``new_memory``) as the pools, copying the ``occupied`` slots
        (all below ``num_slots``); disk files are resized in place. Views of the old pools stay
        readable (they keep the old mapping) but no longer see the pages."""
        for old, new in zip(self.pools, memory, strict=True):
            src, dst, size = old.view(), new.view(), old.slot_size
            if self.populating:
                new.populate(min(self.allocator.next_fresh, num_slots) * size)
            for s in occupied:
                dst[s * size : (s + 1) * size] = src[s * size : (s + 1) * size]
        if self.pools:
            self.pools = memory
        for pool in self.disk_pools:
            pool.resize(num_slots)

    def ensure_backed(self, arriving: int) -> None:
        """Disk blocks for the slots ``arriving`` more pages will take (``DiskOOMError``). Pages
        beyond the free slots take slots that drops free first: written before, so backed."""
        slots = self.allocator.peek(min(arriving, self.allocator.num_free))
        for pool in self.disk_pools:
            pool.ensure_backed(max(slots, default=-1) + 1)

    def shrink_to_backed(self) -> None:
        """A disk whose file system is full keeps only the slots it has blocks for: every slot
        in use was written, so backed, and lies below them."""
        self.allocator.resize(min(pool.backed for pool in self.disk_pools))

    def close(self) -> None:
        for pool in self.disk_pools:
            pool.close()


@contextmanager
def at_level(level: int) -> Iterator[None]:
    """A level's memory or files that fail inside (``OutOfMemoryError``, ``OSError``) raise with
    ``level`` set to the level's index (docs/errors.md, "Which level"), unless already set."""
    try:
        yield
    except (OutOfMemoryError, OSError) as exc:
        if getattr(exc, "level", None) is None:
            exc.level = level  # type: ignore[union-attr]
        raise


class CacheLevel:
    """Level ``index`` of ``config.cache_tiers``: every level has the device level's pool groups."""

    def __init__(
        self, config: KVCacheManagerConfig, registry: LifeCycleRegistry, storage: StorageConfig, index: int
    ) -> None:
        self.index = index
        self.pool_groups: list[PoolGroup] = []
        with at_level(index):
            self.counts = SlotCounts(config, registry, storage, index)
            tier = config.local_tiers[index]
            directory = str(tier.path) if isinstance(tier, DiskCacheTierConfig) else None
            try:
                for pg, n in zip(storage.pool_groups, self.counts.slots, strict=True):
                    self.pool_groups.append(PoolGroup(pg.index, pg.slot_sizes, n, directory, config.populate_memory))
            except BaseException:
                self.close()
                raise

    @property
    def quota(self) -> int:
        return self.counts.quota

    def statistics(self) -> list[StorageStatistics]:
        return [pg.statistics() for pg in self.pool_groups]

    def close(self) -> None:
        """Remove the level's disk files, if it has any."""
        for pg in self.pool_groups:
            pg.close()
