"""What a step of a cache needs and whether it fits: the pages its blocks lack, the pages that go
stale, and room on the device level. "Is there room" is asked three ways, from cheapest to
dearest: ``_fits_pool_groups`` (could the pool groups ever hold it: counted, not listed),
``_can_make_room_after`` (could room be made once this step's own releases apply, changing
nothing) and ``_make_room`` (make it now, evicting or moving other pages down:
``Storage.make_room``)."""

from __future__ import annotations

from array import array
from typing import cast

from kv_api.constants import BAD_PAGE_INDEX, GPU_LEVEL, KVCacheStatus
from kv_api.errors import HostOOMError, OutOfPagesError
from kv_core_py.cache_scratch import CacheScratch
from kv_core_py.cache_state import CacheBlock, CommitState
from kv_core_py.page import Page

#: (ordinal, layer group, keep): a page to give up; ``keep`` holds it (unlocked) for a commit.
Release = tuple[int, int, bool]
#: (ordinal, layer group): a page to allocate; ordinal -1 is a scratch slot (no block).
Need = tuple[int, int]


class CacheRoom(CacheScratch):
    """The room part of ``KVCache``; every method expects the manager's lock held."""

    def _stale_releases(self, history: int) -> list[Release]:
        """Pages of blocks stale at ``history``; an uncommitted page is kept (held, unlocked)
        while it may still be committed. Starts past the blocks already cleared, so a decode
        step does not rescan the whole history."""
        out = []
        # With commit_min_snapshot a page out of the window is not kept for a commit: the tree
        # only gets the state reusable at the committed length.
        allowed = self._commit_state == CommitState.ALLOWED and not self._context.commit_min_snapshot
        for layer_group in self._block_layer_groups:
            begin, end = self._context.registry.stale_range(layer_group, history)
            for ordinal in range(max(begin, self._stale_scan[layer_group]), min(end, len(self._blocks))):
                cache_block = self._blocks[ordinal]
                page = cache_block.pages[layer_group]
                if page is None:
                    continue
                # A block already in the tree never takes our page (``_commit_block`` may keep
                # it private), nor does any block once committing stopped: such a page goes.
                keep = allowed and not page.committed and cache_block.tree_block is None
                if keep and not cache_block.locked[layer_group]:
                    continue  # already kept for commit
                out.append((ordinal, layer_group, keep))
        return out

    def _apply_stale_releases(self, releases: list[Release], history: int) -> None:
        for ordinal, layer_group, keep in releases:
            if keep:
                self._unlock_page(ordinal, layer_group)
            else:
                self._release_page(ordinal, layer_group)
        for layer_group in self._block_layer_groups:
            begin, end = self._context.registry.stale_range(layer_group, history)
            ordinal = max(begin, self._stale_scan[layer_group])
            while ordinal < min(end, len(self._blocks)) and self._blocks[ordinal].pages[layer_group] is None:
                ordinal += 1
            self._stale_scan[layer_group] = ordinal

    def _live_ranges(
        self, layer_group: int, first: int, num_blocks: int, capacity: int, history: int
    ) -> tuple[range, range, range]:
        """The ordinals of ``[first, num_blocks)`` with a page of their own in a layer group:
        below its stale range, between it and the scratch range, and above that (a window's
        stale range spans most of a long history; the scratch range lies above it)."""
        begin, end = self._context.registry.stale_range(layer_group, history)
        a, b = self._scratch_range(layer_group, capacity, history)
        if a == b:
            a = b = end
        return (
            range(first, min(begin, num_blocks)),
            range(max(end, first), min(a, num_blocks)),
            range(max(b, end, first), num_blocks),
        )

    def _missing(self, first: int, num_blocks: int, capacity: int, history: int) -> list[Need]:
        """Non-stale blocks in ``[first, num_blocks)`` without a page, by ordinal then layer
        group. (Every non-stale block below ``num_blocks`` of an open cache has its pages, so a
        resize only needs to look at the blocks it adds.)"""
        out = [
            (ordinal, layer_group)
            for layer_group in self._block_layer_groups
            for live in self._live_ranges(layer_group, first, num_blocks, capacity, history)
            for ordinal in live
            if ordinal >= len(self._blocks) or self._blocks[ordinal].pages[layer_group] is None
        ]
        out.sort()
        return out

    def _fits_pool_groups(self, first: int, num_blocks: int, capacity: int, history: int) -> bool:
        """False when the pages blocks ``[first, num_blocks)`` need exceed a pool group's slots:
        counted, not listed, so a request too large for the pool is refused in constant time."""
        storage = self._context.storage
        per_pool_group = [0] * len(storage.pool_groups)
        for layer_group in self._block_layer_groups:
            live = sum(len(r) for r in self._live_ranges(layer_group, first, num_blocks, capacity, history))
            scratch = self._scratch_need(layer_group, capacity, history) - len(self._scratch_pages[layer_group])
            per_pool_group[storage.config.pool_group_of(layer_group)] += live + max(0, scratch)
        return all(n <= pg.num_slots for pg, n in zip(storage.pool_groups, per_pool_group, strict=True))

    def _can_make_room_after(self, needs: list[Need], releases: list[Release], scratch_freed: list[Page]) -> bool:
        """Whether room can be made for ``needs`` once ``releases`` are applied in order: pages
        they free, and pages they make evictable (queued first); ``scratch_freed`` (private
        scratch pages) are freed too. Changes nothing."""
        storage = self._context.storage
        need = [0] * len(storage.pool_groups)
        for _, layer_group in needs:
            need[storage.config.pool_group_of(layer_group)] += 1
        freed = [0] * len(storage.pool_groups)
        for scratch in scratch_freed:
            freed[scratch.pool_group] += 1
        pending: list[Page] = []
        for ordinal, layer_group, keep in releases:
            cache_block = self._blocks[ordinal]
            page = cache_block.pages[layer_group]
            if page is None:
                continue
            locks = page.locks - cache_block.locked[layer_group]
            holders = page.holders - (not keep)
            if holders == 0 and page.block is None:
                freed[page.pool_group] += 1
            elif (
                not page.queued
                and not locks
                and (page.block is not None if holders == 0 else page.level < storage.last)
            ):
                pending.append(page)
        return storage.can_make_room(GPU_LEVEL, need, pending, freed)

    def _make_room(self, level: int, pages: list[Page], needs: list[Need], keep: list[Page] | None = None) -> bool:
        """Room at ``level`` for ``pages`` (this cache's, to move there) and ``needs`` (new
        pages), never evicting ``keep``. False, nothing changed, if short."""
        storage = self._context.storage
        need = [0] * len(storage.pool_groups)
        for page in pages:
            need[page.pool_group] += 1
        for _, layer_group in needs:
            need[storage.config.pool_group_of(layer_group)] += 1
        if not any(need):
            return True  # a cached prompt resuming on the device: no set of the pages to keep
        try:
            storage.make_room(level, need, frozenset(id(p) for p in keep or ()))
        except OutOfPagesError:
            return False
        return True

    def _new_pages(self, needs: list[Need], priorities: list[int]) -> list[Page]:
        """Pages for ``needs`` (held by this cache, not yet placed); OutOfPagesError if short."""
        pages = self._context.storage.new_pages(
            [(layer_group, p) for (_, layer_group), p in zip(needs, priorities, strict=True)]
        )
        self.stats.allocated(needs)
        for page in pages:
            page.holders = 1
        return pages

    def _new_blocks(self, n: int) -> tuple[list[CacheBlock], array[int]] | None:
        """``n`` empty blocks and their page indices, made before a resize changes anything: a
        block table the host cannot hold is a ``HostOOMError`` with the cache unchanged."""
        if n <= 0:
            return None
        try:
            blocks: list[CacheBlock | None] = [None] * n  # sized at once: a table beyond memory fails here
            for i in range(n):
                blocks[i] = CacheBlock(len(self._life_cycles))
            return cast(list[CacheBlock], blocks), array("i", [BAD_PAGE_INDEX]) * n
        except MemoryError:
            raise HostOOMError(f"resize: cannot allocate {n} blocks") from None

    def _to_lock(self) -> list[Page]:
        """The pages ``resume`` locks: held, not stale, not a reused partial block's (copied),
        and the SSM states."""
        return [
            page
            for ordinal, cache_block in enumerate(self._blocks)
            if not cache_block.copy_on_resume
            for layer_group, page in enumerate(cache_block.pages)
            if page is not None and not self._is_stale(layer_group, ordinal, self._history)
        ] + [p for p in self._ssm_state if p is not None]

    def _scratch_needs(self, capacity: int, history: int) -> list[Need]:
        """The scratch slots the layer groups lack at these lengths (ordinal -1: no block)."""
        return [
            (-1, layer_group)
            for layer_group in self._block_layer_groups
            for _ in range(
                max(0, self._scratch_need(layer_group, capacity, history) - len(self._scratch_pages[layer_group]))
            )
        ]

    def _suspend_locked(self) -> None:
        """Unlock every page and free the scratch slots: a suspend, and what a resize whose
        allocation failed falls back to."""
        for ordinal in range(len(self._blocks)):
            for group in range(len(self._life_cycles)):
                self._unlock_page(ordinal, group)
        self._unlock_states()
        for group in self._block_layer_groups:
            self._free_scratch(group, 0)
        self._status = KVCacheStatus.SUSPENDED
