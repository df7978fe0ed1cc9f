"""Resizing an active cache (docs/manager.md, "KV cache"): new capacity and history checked, the
pages they release and need worked out before anything changes, then applied."""

from __future__ import annotations

from array import array
from typing import Any, NamedTuple

from kv_api._check import int_in_range
from kv_api.constants import DEFAULT_PRIORITY, GPU_LEVEL, TOKEN_LIMIT, KVCacheStatus, ceil_div
from kv_api.errors import OutOfPagesError
from kv_core_py import poison
from kv_core_py.cache_room import CacheRoom, Need, Release
from kv_core_py.cache_state import CacheBlock
from kv_core_py.page import Page
from kv_core_py.page_indices import PageIndices


class ResizePlan(NamedTuple):
    """What a resize changes, worked out before anything does."""

    shrink: list[tuple[int, int]]  # pages of the blocks past the new end, last first
    releases: list[Release]  # stale pages below the new end
    scratch_drops: list[Release]  # pages of blocks entering the scratch range
    scratch_freed: list[Page]  # scratch slots past the new count
    needs: list[Need]
    priorities: list[int]


class CacheResize(CacheRoom, PageIndices):
    """The resize part of ``KVCache``: ``resize`` and the ``capacity`` / ``history_length``
    setters' checks."""

    def _set_length(self, name: str, value: Any) -> None:
        """``resize`` with one length, an int: None is refused (after the state check, as resize
        orders them), since resize takes it as "unchanged" and the assignment would do nothing."""
        with self._context.lock:
            self._require(KVCacheStatus.ACTIVE, "resize")
            if value is None:
                raise TypeError(f"{name}: expected an int, got NoneType")
            if name == "capacity" and self._scratch_on:
                # Alone, a new capacity keeps the history, which the scratch rule rarely allows.
                raise ValueError("capacity: cannot be set alone with SWA scratch reuse enabled (use resize)")
            if not (self.resize(value, None) if name == "capacity" else self.resize(None, value)):
                raise OutOfPagesError(f"{name}: not enough pages")

    def resize(self, capacity: int | None = None, history_length: int | None = None) -> bool:
        """Set capacity and/or history (ACTIVE only). History never decreases and capacity never
        drops below it (``ValueError``). False, with nothing changed, when pages run out."""
        poison.check()
        with self._context.lock:
            self._require(KVCacheStatus.ACTIVE, "resize")
            new_capacity, history = self._checked_lengths(capacity, history_length)
            num_blocks = ceil_div(new_capacity, self._tokens_per_block)
            for group, buf in self._user_buffers.items():
                if len(buf) < num_blocks:
                    raise ValueError(
                        f"base page index buffer of layer group {group} too short: {len(buf)} < {num_blocks}"
                    )
            if not self._fits_pool_groups(len(self._blocks), num_blocks, new_capacity, history):
                return False
            plan = self._resize_plan(num_blocks, new_capacity, history)
            applied = [(ordinal, group, False) for ordinal, group in plan.shrink] + plan.releases + plan.scratch_drops
            if plan.needs and not applied and not plan.scratch_freed:
                # Room made before anything changes: a failing copy leaves the cache as it was.
                if not self._make_room(GPU_LEVEL, [], plan.needs):
                    return False
            elif plan.needs and not self._can_make_room_after(plan.needs, applied, plan.scratch_freed):
                return False
            grown = self._new_blocks(num_blocks - len(self._blocks))
            self._apply_resize(plan, num_blocks, new_capacity, history, grown)
            try:
                new = self._new_pages(plan.needs, plan.priorities)
            except Exception:
                # Making room after this call's releases failed (a copy): the new lengths stay and
                # the cache is suspended; resume() allocates the missing pages.
                self._suspend_locked()
                self._sync_user_buffers()
                raise
            for (ordinal, group), page in zip(plan.needs, new, strict=True):
                if ordinal < 0:
                    self._scratch_pages[group].append(page)
                    self._context.storage.lock(page)
                    continue
                self._blocks[ordinal].pages[group] = page
                self._lock_page(ordinal, group)
            self._sync_user_buffers()
            return True

    def _checked_lengths(self, capacity: int | None, history_length: int | None) -> tuple[int, int]:
        """A resize's new (capacity, history), checked; ``ValueError`` before anything changes."""
        new_capacity = self._capacity if capacity is None else int_in_range("capacity", capacity, 0, TOKEN_LIMIT)
        history = (
            self._history if history_length is None else int_in_range("history_length", history_length, 0, TOKEN_LIMIT)
        )
        if history < self._history:
            raise ValueError(f"history_length: cannot decrease ({self._history} -> {history})")
        if new_capacity < history:
            raise ValueError(f"capacity: {new_capacity} is below history_length {history}")
        if self._scratch_on and new_capacity != self._capacity:
            # Blocks that were scratch must be stale at the new history (their data is gone),
            # and no token may be skipped.
            assert self._context.swa_scratch_reuse is not None
            low = max(0, self._capacity - self._context.swa_scratch_reuse.max_rewind_len)
            if not low <= history <= self._capacity:
                raise ValueError(
                    f"resize: with SWA scratch reuse, a new capacity needs history_length in"
                    f" [{low}, {self._capacity}] (got {history})"
                )
        self._check_scratch_history("resize", new_capacity, history)
        return new_capacity, history

    def _resize_plan(self, num_blocks: int, capacity: int, history: int) -> ResizePlan:
        shrink = [
            (ordinal, group)
            for ordinal in range(num_blocks, len(self._blocks))
            for group in range(len(self._life_cycles))
        ]
        needs = self._missing(len(self._blocks), num_blocks, capacity, history)
        priorities = [self._priority_of(ordinal, group) for ordinal, group in needs]
        # Scratch: pages of blocks entering the scratch range go (they hold tokens this step
        # rewrites); slots are added or freed to the new count.
        scratch_drops: list[Release] = []
        scratch_freed: list[Page] = []
        for group in self._block_layer_groups:
            a, b = self._scratch_range(group, capacity, history)
            scratch_drops += [
                (ordinal, group, False)
                for ordinal in range(a, min(b, len(self._blocks)))
                if self._blocks[ordinal].pages[group] is not None
            ]
            want, held = self._scratch_need(group, capacity, history), self._scratch_pages[group]
            needs += [(-1, group)] * max(0, want - len(held))  # after every block's need, as resume orders them
            priorities += [DEFAULT_PRIORITY] * max(0, want - len(held))
            scratch_freed += held[want:]
        releases = [r for r in self._stale_releases(history) if r[0] < num_blocks]
        return ResizePlan(shrink[::-1], releases, scratch_drops, scratch_freed, needs, priorities)

    def _apply_resize(
        self,
        plan: ResizePlan,
        num_blocks: int,
        capacity: int,
        history: int,
        grown: tuple[list[CacheBlock], array[int]] | None,
    ) -> None:
        """Give up the pages ``plan`` releases and set the new blocks and lengths."""
        for ordinal, group in plan.shrink:
            self._release_page(ordinal, group)
        self._apply_stale_releases(plan.releases, history)
        for ordinal, group, _ in plan.scratch_drops:
            self._release_page(ordinal, group)
        for group in self._block_layer_groups:
            self._free_scratch(group, self._scratch_need(group, capacity, history))
        del self._blocks[num_blocks:]
        for index in self._index:
            del index[num_blocks:]
        if grown is not None:
            blocks, indices = grown
            self._blocks.extend(blocks)
            for index in self._index:
                index.extend(indices)
        self._capacity, self._history = capacity, history
