"""The cache levels and what moves pages between them: page status and eviction queues, making
room by cascading eviction, moving pages up, and what dropping a committed page does to the
radix tree (docs/manager.md, "Eviction and tiers")."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import NoReturn

from kv_api.errors import DiskOOMError, OutOfPagesError
from kv_api.stats import StorageStatistics
from kv_core_py import poison
from kv_core_py.cache_level import CacheLevel, PoolGroup
from kv_core_py.event_manager import KVCacheEventManager
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.page import Page
from kv_core_py.page_transfer import PageTransfer
from kv_core_py.radix_tree import Block, RadixTree
from kv_core_py.slot_counts import SlotCounts
from kv_core_py.storage_config import StorageConfig


class Plan:
    """What making room does in one pool group: pages moved down (to a level), the last
    level's victims (dropped in order while room is short) and falling pages that find no slot
    there (droppable, dropped)."""

    __slots__ = ("drops", "lost", "moves")

    def __init__(self) -> None:
        self.moves: list[tuple[Page, int]] = []
        self.drops: list[Page] = []
        self.lost: list[Page] = []


class Storage:
    def __init__(
        self,
        config: StorageConfig,
        levels: list[CacheLevel],
        registry: LifeCycleRegistry,
        tree: RadixTree,
        events: KVCacheEventManager | None,
        transfer: PageTransfer,
    ) -> None:
        self.config = config
        self.levels = levels
        self.last = len(levels) - 1
        self.registry = registry
        self.tree = tree
        self.events = events
        self.transfer = transfer
        self.num_evicted = 0  # pages evicted from the device level
        self.num_onboarded = 0  # pages moved up to the device level
        self.num_corrupt = 0  # pages whose bytes failed their checksum on the way up
        self.num_disk_full = 0  # times the disk tier's file system was full (its level shrank)

    @property
    def pool_groups(self) -> list[PoolGroup]:
        """The device level's."""
        return self.levels[0].pool_groups

    def group(self, page: Page) -> PoolGroup:
        return self.levels[page.level].pool_groups[page.pool_group]

    def statistics(self, level: int = 0) -> list[StorageStatistics]:
        return self.levels[level].statistics()

    def close(self) -> None:
        for level in self.levels:
            level.close()

    # -- page status ------------------------------------------------------------------------------

    def evictable(self, page: Page) -> bool:
        """Not locked, and committed and droppable, or held above the last level."""
        if page.locks:
            return False
        if page.holders:
            return page.level < self.last
        return page.block is not None

    def _update(self, page: Page) -> None:
        """Queue or unqueue ``page`` as its status says; a page staying evictable keeps its place."""
        should = self.evictable(page)
        if page.queued != should:
            queue = self.group(page).evictable
            if should:
                queue.push(page)
            else:
                queue.remove(page)
            page.queued = should

    def settle(self, page: Page) -> None:
        """A page that entered the tree from outside a cache (the remote tier's) joins its queue."""
        self._update(page)

    def _dequeue(self, page: Page) -> None:
        if page.queued:
            self.group(page).evictable.remove(page)
            page.queued = False

    def hold(self, page: Page, priority: int | None = None) -> None:
        """A cache keeps ``page``; a higher ``priority`` (reuse) raises the page's and re-queues it."""
        if priority is not None and priority > page.priority:
            self._dequeue(page)
            page.priority = priority
        page.holders += 1
        self._update(page)

    def unhold(self, page: Page) -> None:
        """A cache lets go of ``page``: an uncommitted page nobody holds is freed at once."""
        page.holders -= 1
        if page.holders or page.block is not None:
            self._update(page)
        else:
            self._dequeue(page)
            self.free(page)

    def lock(self, page: Page) -> None:
        if page.level != 0:
            raise poison.corrupted(f"locking a page at cache level {page.level}")
        page.locks += 1
        self._update(page)

    def unlock(self, page: Page) -> None:
        page.locks -= 1
        self._update(page)

    def free(self, page: Page) -> None:
        self.group(page).allocator.release(page.slot)

    # -- new pages and copies ----------------------------------------------------------------------

    def new_pages(self, requests: list[tuple[int, int]]) -> list[Page]:
        """One device page per ``(layer_group, priority)``, all or none (``OutOfPagesError``,
        nothing changed): room is made first, then each group hands out its slots in order."""
        need = [0] * len(self.pool_groups)
        for layer_group, _ in requests:
            need[self.config.pool_group_of(layer_group)] += 1
        self.make_room(0, need)
        slots = [pg.allocate(n) for pg, n in zip(self.pool_groups, need, strict=True)]
        handed = [iter(s) for s in slots]  # each group's slots, in allocation order
        return [
            Page(next(handed[p]), layer_group, p, priority)
            for layer_group, priority in requests
            for p in (self.config.pool_group_of(layer_group),)
        ]

    def copy(self, src: Page, dst: Page) -> None:
        """Copy a page's data (every pool of its group) into another page's slot, from any level;
        a source that fails its checksum is forgotten (``OSError``)."""
        if self.transfer.copy(src.level, dst.level, src.pool_group, [(src.slot, dst.slot)]):
            self.forget_corrupt([src])

    # -- making room ---------------------------------------------------------------------------------

    def plan(
        self,
        level: int,
        need: Sequence[int],
        exclude: AbstractSet[int] = frozenset(),
        pending: Sequence[Page] = (),
        freed: Sequence[int] = (),
    ) -> list[Plan]:
        """Per pool group, what ``make_room`` would do; ``OutOfPagesError`` (nothing changed)
        when ``need[pg]`` slots cannot be freed at ``level`` or held pages would find no slot.
        ``pending`` pages join ``level``'s queues first and ``freed[pg]`` slots are freed there
        first (a resize's releases)."""
        plans = []
        for pg in range(len(self.pool_groups)):
            plan = Plan()
            goal, arrivals = need[pg], list[Page]()
            for lv in range(level, len(self.levels)):
                group = self.levels[lv].pool_groups[pg]
                free = group.allocator.num_free + (freed[pg] if lv == level and freed else 0)
                queued = [p for p in pending if p.pool_group == pg] if lv == level else []
                want = goal + len(arrivals) - free
                chosen: list[Page] = []
                if want > 0:
                    for page in group.evictable.candidates(exclude, queued):
                        chosen.append(page)
                        if len(chosen) == want:
                            break
                room = free + len(chosen) - goal  # slots left for the pages falling in
                if lv == self.last:
                    held = sum(1 for p in arrivals if p.holders > 0)
                    if room < held:
                        if lv == level:
                            raise OutOfPagesError(
                                f"pool group {pg}: need {goal} slots, {free} free and {len(chosen)} evictable"
                            )
                        raise OutOfPagesError(
                            f"cache level {lv}, pool group {pg}: {held} held pages fall in, {free} free and "
                            f"{len(chosen)} evictable"
                        )
                    plan.drops = chosen
                    plan.lost = [p for p in arrivals if not p.holders][: max(0, len(arrivals) - room)]
                    lost = {id(p) for p in plan.lost}
                    plan.moves += [(p, lv) for p in arrivals if id(p) not in lost]
                else:
                    if room < 0:
                        raise OutOfPagesError(
                            f"pool group {pg}: need {goal} slots, {free} free and {len(chosen)} evictable"
                        )
                    passing = max(0, len(arrivals) - room)  # the least valuable fall further
                    plan.moves += [(p, lv) for p in arrivals[passing:]]
                    arrivals = chosen + arrivals[:passing]
                goal = 0
            plans.append(plan)
        return plans

    def can_make_room(
        self, level: int, need: Sequence[int], pending: Sequence[Page] = (), freed: Sequence[int] = ()
    ) -> bool:
        try:
            self.plan(level, need, pending=pending, freed=freed)
        except OutOfPagesError:
            return False
        return True

    def make_room(self, level: int, need: Sequence[int], exclude: AbstractSet[int] = frozenset()) -> None:
        """Free ``need[pg]`` slots at ``level`` by cascading eviction, or raise with nothing
        changed. Disk blocks for the pages that may fall there are allocated before anything
        moves. Each pool group's plan runs deepest level first (the last level's drops, then
        the moves into each level), so every slot is emptied before it is filled."""
        if not any(need):
            return  # the decode step's usual case: nothing to plan
        plans = self.plan(level, need, exclude)
        while not self._back_disks(level, plans):
            plans = self.plan(level, need, exclude)  # against the smaller disk: drops, not moves
        for pg, plan in enumerate(plans):
            last = self.levels[self.last].pool_groups[pg]
            target = (need[pg] if level == self.last else 0) + sum(
                1 for p, d in plan.moves if d == self.last and p.alive
            )
            for page in plan.drops:
                if last.allocator.num_free >= target:
                    break
                if page.alive:
                    self._evict_drop(page)
            for page in plan.lost:
                if page.alive:
                    self._evict_drop(page)
            for dst in reversed(range(level + 1, len(self.levels))):
                for src in range(level, dst):
                    self._move_down([p for p, d in plan.moves if d == dst and p.alive and p.level == src], dst)

    def _back_disks(self, level: int, plans: list[Plan]) -> bool:
        """Disk blocks for every page the plans send to disk. A file system that cannot give
        them shrinks its level to the slots it has (counted): False, the plans are to be made
        again, so a full disk means dropping instead of moving down, never refusing the work."""
        for pg, plan in enumerate(plans):
            for lv in range(level + 1, len(self.levels)):
                group = self.levels[lv].pool_groups[pg]
                if group.on_disk:
                    try:
                        group.ensure_backed(sum(1 for _, d in plan.moves if d == lv))
                    except DiskOOMError:
                        group.shrink_to_backed()
                        self.num_disk_full += 1
                        return False
        return True

    def forget_corrupt(self, pages: list[Page]) -> NoReturn:
        """``pages`` came back from disk with bytes that fail their checksum: counted, taken
        out of the tree (announced as removed) so no match finds them again, then ``OSError``
        (EIO): a miss from now on, never data. Only pages a cache holds are read, so each stays
        its holders' (their data is lost: the call that read it fails) until they let go."""
        self.num_corrupt += len(pages)
        directory = self.group(pages[0]).disk_pools[0].directory
        for page in pages:
            block = page.block
            if not isinstance(block, Block):
                continue
            block.pages[page.layer_group] = None
            if self.events is not None:
                self.events.removed(block, page.layer_group)
            self.orphan(page)
            self.tree.prune(block)
        raise OSError(errno.EIO, f"disk tier: {len(pages)} page(s) failed their checksum in {directory}: dropped")

    def _evict_drop(self, page: Page) -> None:
        if page.level == 0:
            self.num_evicted += 1
        self._dequeue(page)
        self.drop(page)

    def _move_down(self, pages: list[Page], dst_level: int) -> None:
        """Move ``pages`` (one level, one pool group) down to ``dst_level``; if it lacks slots
        for all (a drop took fewer pages than planned), the first droppable ones drop instead."""
        if not pages:
            return
        src_level = pages[0].level
        below = self.levels[dst_level].pool_groups[pages[0].pool_group]
        surplus = len(pages) - below.allocator.num_free
        dropped: list[Page] = []
        if surplus > 0:
            dropped = [p for p in pages if not p.holders][:surplus]
            if len(dropped) < surplus:
                raise poison.corrupted("held pages fall to a level without room for them")
        gone = {id(p) for p in dropped}
        movers = [p for p in pages if id(p) not in gone]
        self.move(movers, dst_level)
        if src_level == 0:
            self.num_evicted += len(movers)
        for page in dropped:
            if page.alive:
                self._evict_drop(page)

    def move(self, pages: list[Page], dst_level: int) -> None:
        """Move ``pages`` (one level, one pool group) to ``dst_level``, which has the free slots:
        bytes first (a failure leaves every page where it was), then slots, levels and queues."""
        if not pages:
            return
        src_level, pg = pages[0].level, pages[0].pool_group
        group = self.levels[dst_level].pool_groups[pg]
        slots = group.allocator.peek(len(pages))
        bad = self.transfer.copy(src_level, dst_level, pg, [(p.slot, s) for p, s in zip(pages, slots, strict=True)])
        if bad:
            corrupt = set(bad)
            self.forget_corrupt([p for p in pages if p.slot in corrupt])
        group.allocate(len(pages))
        for page, slot in zip(pages, slots, strict=True):
            self._dequeue(page)
            self.free(page)
            page.level, page.slot = dst_level, slot
            if isinstance(page.block, Block) and self.events is not None:
                self.events.updated(page.block, page.layer_group, src_level, dst_level)
            self._update(page)
        if dst_level == 0:
            self.num_onboarded += len(pages)

    def move_up(self, pages: list[Page], dst_level: int) -> None:
        """Move pages from colder levels to ``dst_level`` (room made), in batches per pool group
        then source level, each in the given order."""
        for pg in range(len(self.pool_groups)):
            for lv in range(dst_level + 1, len(self.levels)):
                self.move([p for p in pages if p.pool_group == pg and p.level == lv], dst_level)

    # -- quota resize ----------------------------------------------------------------------------------

    def resize_level(self, level: int, counts: SlotCounts, live: list[Page]) -> None:
        """Give ``level`` the slot counts of ``counts``: new memory first, then room made in each
        shrinking group (``OutOfPagesError``, nothing changed, if it cannot be), then its pages in
        slots beyond the new size moved to free low slots, then the pools remapped. ``live`` is
        every page the tree or a cache has."""
        groups = self.levels[level].pool_groups
        new = counts.slots
        memory = [g.new_memory(n) if n != g.num_slots else [] for g, n in zip(groups, new, strict=True)]
        self.make_room(level, [max(0, g.num_slots - n) for g, n in zip(groups, new, strict=True)])
        for pg, group in enumerate(groups):
            n = new[pg]
            if n == group.num_slots:
                continue
            mine = sorted(
                (p for p in live if p.alive and p.level == level and p.pool_group == pg), key=lambda p: p.slot
            )
            movers = [p for p in mine if p.slot >= n]
            slots = group.allocator.peek(len(movers), below=n)
            # A corrupt page moves with its bytes, still failing its checksum: found when read up.
            self.transfer.copy(level, level, pg, [(p.slot, s) for p, s in zip(movers, slots, strict=True)])
            group.allocator.resize(n)
            group.allocate(len(movers))
            for page, slot in zip(movers, slots, strict=True):
                page.slot = slot
            group.remap(n, memory[pg], sorted(p.slot for p in mine))
        self.levels[level].counts = counts

    # -- the tree's pages ----------------------------------------------------------------------------

    def adopt(self, block: Block, sibling: Block) -> None:
        """``block`` replaces ``sibling``, a partial block whose tokens it extends, and takes its
        pages with their coverage, so the shorter endpoint stays reusable. The sibling leaves
        the tree (Removed). A page a cache holds leaves with it: that cache (the sibling's
        writer, or a reader yet to copy it) holds none of ``block``'s other pages, so evicting
        those would take ``block`` from under it."""
        for layer_group, page in enumerate(sibling.pages):
            if page is None:
                continue
            sibling.pages[layer_group] = None
            if self.events is not None:
                self.events.removed(sibling, layer_group)
            if page.holders:
                self.orphan(page)
            else:
                page.block = block
                block.pages[layer_group] = page
        self.tree.detach(sibling)

    def replace(self, block: Block, layer_group: int, page: Page) -> None:
        """``page`` (uncommitted, covering the whole block) takes the place of the block's page
        in ``layer_group``, which is orphaned; the block's level changes to ``page``'s."""
        old = block.pages[layer_group]
        assert old is not None
        page.block = block
        page.num_tokens = old.num_tokens
        block.pages[layer_group] = page
        self.orphan(old)
        self._update(page)
        if self.events is not None and old.level != page.level:
            self.events.updated(block, layer_group, old.level, page.level)

    def orphan(self, page: Page) -> None:
        """``page`` leaves the tree undropped (a wider page or a longer block replaced it):
        freed now if nobody holds it, else when its holders let go, as an uncommitted page is."""
        page.block = None
        if not page.holders:
            self._dequeue(page)
            self.free(page)
        else:
            self._update(page)

    def drop(self, page: Page) -> None:
        """Evict a committed droppable page. Losing a full-attention or sink page makes every
        later block unusable, so the block's whole subtree goes; a window page or an SSM
        snapshot goes alone.
        Then empty, page-less ancestors are pruned."""
        block = page.block
        assert isinstance(block, Block)
        level = page.level  # where the blocks leaving the tree fell from (the ghost record's)
        self._discard(block, page.layer_group)
        if self.registry.kinds[page.layer_group].drop_takes_subtree(block.ordinal):
            for b in list(RadixTree.subtree(block)):
                if b.pins:
                    raise poison.corrupted(f"a pinned block in a removed subtree (block {b.ordinal})")
                for layer_group, p in enumerate(b.pages):
                    if p is not None:
                        if p.holders:
                            raise poison.corrupted(
                                f"held page in a removed subtree (block {b.ordinal}, life cycle {layer_group})"
                            )
                        self._dequeue(p)
                        self._discard(b, layer_group)
            parent = block.parent
            self.tree.detach(block, level)
            assert parent is not None
            self.tree.prune(parent, level)
        else:
            self.tree.prune(block, level)

    def drop_now(self, page: Page) -> None:
        """Drop a committed droppable page out of turn (a planned drop): as an eviction would,
        but not counted as one."""
        self._dequeue(page)
        self.drop(page)

    def _discard(self, block: Block, layer_group: int) -> None:
        page = block.pages[layer_group]
        assert page is not None
        block.pages[layer_group] = None
        page.block = None
        self.free(page)
        if self.events is not None:
            self.events.removed(block, layer_group)

    def clear(self) -> None:
        """Drop every committed page (all droppable: no cache is open) and empty the tree."""
        for root in list(self.tree.roots.values()):
            for child in list(root.children.values()):
                for b in list(RadixTree.subtree(child)):
                    for layer_group, p in enumerate(b.pages):
                        if p is not None:
                            self._dequeue(p)
                            self._discard(b, layer_group)
        self.tree.clear()
