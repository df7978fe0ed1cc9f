"""Pool groups at the device level: slot allocators, real memory, eviction, and what dropping a
committed page does to the radix tree (docs/manager.md, "Eviction")."""

from __future__ import annotations

from kv_api.errors import CorruptedError, OutOfPagesError
from kv_api.stats import StorageStatistics
from kv_core_py.event_manager import KVCacheEventManager
from kv_core_py.eviction import EvictionQueue
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.memory_pool import MemoryPool
from kv_core_py.page import Page
from kv_core_py.radix_tree import Block, RadixTree
from kv_core_py.slot_allocator import SlotAllocator
from kv_core_py.slot_counts import SlotCounts
from kv_core_py.storage_config import StorageConfig


class PoolGroup:
    def __init__(self, index: int, slot_sizes: tuple[int, ...], num_slots: int) -> None:
        self.index = index
        self.allocator = SlotAllocator(num_slots)
        self.pools = [MemoryPool(num_slots, size) for size in slot_sizes]
        self.evictable = EvictionQueue()

    @property
    def num_slots(self) -> int:
        return self.allocator.num_slots

    def statistics(self) -> StorageStatistics:
        return StorageStatistics(self.num_slots, self.allocator.num_free, len(self.evictable))

    def utilization(self) -> float:
        stats = self.statistics()
        return stats.unavailable / stats.total


class Storage:
    def __init__(
        self,
        config: StorageConfig,
        counts: SlotCounts,
        registry: LifeCycleRegistry,
        tree: RadixTree,
        events: KVCacheEventManager | None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.tree = tree
        self.events = events
        self.pool_groups = [
            PoolGroup(pg.index, pg.slot_sizes, n) for pg, n in zip(config.pool_groups, counts.slots, strict=True)
        ]
        self.num_evicted = 0

    def statistics(self) -> list[StorageStatistics]:
        return [pg.statistics() for pg in self.pool_groups]

    def new_pages(self, requests: list[tuple[int, int]]) -> list[Page]:
        """One page per ``(life_cycle, priority)``, all or none: each pool group first checks
        that free plus evictable slots cover its share, then evicts what it must."""
        need = [0] * len(self.pool_groups)
        for lc, _ in requests:
            need[self.config.pool_group_of(lc)] += 1
        for pg, n in zip(self.pool_groups, need, strict=True):
            if n > pg.allocator.num_free + len(pg.evictable):
                raise OutOfPagesError(
                    f"pool group {pg.index}: need {n} slots, {pg.allocator.num_free} free and "
                    f"{len(pg.evictable)} evictable"
                )
        slots: list[list[int]] = []
        for pg, n in zip(self.pool_groups, need, strict=True):
            while pg.allocator.num_free < n:
                self.drop(pg.evictable.pop())
                self.num_evicted += 1
            slots.append(pg.allocator.allocate(n))
        handed = [iter(s) for s in slots]  # each group's slots, in allocation order
        return [
            Page(next(handed[p]), lc, p, priority)
            for lc, priority in requests
            for p in (self.config.pool_group_of(lc),)
        ]

    def copy(self, src: Page, dst: Page) -> None:
        """Copy a page's data (every pool of its group) into another page's slot."""
        for pool in self.pool_groups[src.pool_group].pools:
            pool.copy_slot(src.slot, dst.slot)

    def free(self, page: Page) -> None:
        self.pool_groups[page.pool_group].allocator.release(page.slot)

    def hold(self, page: Page) -> None:
        if page.holders == 0 and page.committed:
            self.pool_groups[page.pool_group].evictable.remove(page)
        page.holders += 1

    def unhold(self, page: Page) -> None:
        """A cache lets go of ``page``: a committed page nobody holds becomes evictable, an
        uncommitted one is freed at once."""
        page.holders -= 1
        if page.holders:
            return
        if page.committed:
            self.pool_groups[page.pool_group].evictable.push(page)
        else:
            self.free(page)

    def adopt(self, block: Block, sibling: Block) -> None:
        """``block`` replaces ``sibling``, a partial block whose tokens it extends, and takes its
        pages with their coverage, so the shorter endpoint stays reusable. The sibling leaves
        the tree (Removed). A page a cache holds leaves with it: that cache (the sibling's
        writer, or a reader yet to copy it) holds none of ``block``'s other pages, so evicting
        those would take ``block`` from under it."""
        for lc, page in enumerate(sibling.pages):
            if page is None:
                continue
            sibling.pages[lc] = None
            if self.events is not None:
                self.events.removed(sibling, lc)
            if page.holders:
                self.orphan(page)
            else:
                page.block = block
                block.pages[lc] = page
        self.tree.detach(sibling)

    def orphan(self, page: Page) -> None:
        """``page`` leaves the tree undropped (a wider page or a longer block replaced it):
        freed now if nobody holds it, else when its holders let go, as an uncommitted page is."""
        page.block = None
        if not page.holders:
            self.pool_groups[page.pool_group].evictable.remove(page)
            self.free(page)

    def drop(self, page: Page) -> None:
        """Evict a committed droppable page. Losing a full-attention or sink page makes every
        later block unusable, so the block's whole subtree goes; a window page goes alone.
        Then empty, page-less ancestors are pruned."""
        block = page.block
        assert isinstance(block, Block)
        self._discard(block, page.life_cycle)
        life = self.registry.life_cycles[page.life_cycle]
        if life.window is None or block.ordinal < life.num_sink_blocks:
            for b in list(RadixTree.subtree(block)):
                for lc, p in enumerate(b.pages):
                    if p is not None:
                        if p.holders:
                            raise CorruptedError(f"held page in a removed subtree (block {b.ordinal}, life cycle {lc})")
                        self.pool_groups[p.pool_group].evictable.remove(p)
                        self._discard(b, lc)
            parent = block.parent
            self.tree.detach(block)
            assert parent is not None
            self.tree.prune(parent)
        else:
            self.tree.prune(block)

    def _discard(self, block: Block, life_cycle: int) -> None:
        page = block.pages[life_cycle]
        assert page is not None
        block.pages[life_cycle] = None
        page.block = None
        self.free(page)
        if self.events is not None:
            self.events.removed(block, life_cycle)

    def clear(self) -> None:
        """Drop every committed page (all droppable: no cache is open) and empty the tree."""
        for root in list(self.tree.roots.values()):
            for child in list(root.children.values()):
                for b in list(RadixTree.subtree(child)):
                    for lc, p in enumerate(b.pages):
                        if p is not None:
                            self.pool_groups[p.pool_group].evictable.remove(p)
                            self._discard(b, lc)
        self.tree.roots.clear()
