"""One request's KV cache: its blocks, pages and lengths, and the state machine over them
(docs/manager.md, "KV cache")."""

from __future__ import annotations

import enum
from array import array
from typing import Any, cast

import kv_api
from kv_api._check import int_in_range
from kv_api.constants import (
    BAD_PAGE_INDEX,
    DEFAULT_PRIORITY,
    GPU_LEVEL,
    MAX_PRIORITY,
    MIN_PRIORITY,
    TOKEN_LIMIT,
    KVCacheStatus,
    PageIndexMode,
    ceil_div,
)
from kv_api.contract import PriorityCallback
from kv_api.descriptors import ScratchDesc
from kv_api.dlpack import as_buffer
from kv_api.errors import HostOOMError, InvalidStateError, LogicError, OutOfPagesError
from kv_api.keys import Token
from kv_api.scope import ReuseScope
from kv_api.stats import KVCacheStatsDelta
from kv_core_py import planned_drop, poison
from kv_core_py.block_keys import chained_keys
from kv_core_py.cache_context import CacheContext
from kv_core_py.page import Page
from kv_core_py.radix_tree import Block, Node
from kv_core_py.request_stats import RequestStats, first_digest, text_only_error
from kv_core_py.tokens import Tokens


class CommitState(enum.IntEnum):
    ALLOWED = 0
    USER_STOP = 1  # stop_committing() or close(): the partial tail was committed
    VIRTUAL_STOP = 2  # a block could not enter the tree; later tokens are only recorded


class CacheBlock:
    """One block ordinal of one cache: a page per life cycle (None when stale or dropped)."""

    __slots__ = ("copy_on_resume", "locked", "pages", "tree_block")

    def __init__(self, num_life_cycles: int) -> None:
        self.pages: list[Page | None] = [None] * num_life_cycles
        self.locked = [False] * num_life_cycles
        self.tree_block: Block | None = None  # the tree block once this block is committed
        self.copy_on_resume = False  # pages are a reused partial block's, shared with the tree


class KVCache(kv_api.KVCache):
    """Created SUSPENDED by ``KVCacheManager.create_kv_cache``, with the manager's ``CacheContext``;
    see ``kv_api.KVCache``. Every public member checks the poison latch first (``poison.py``)."""

    def __init__(
        self,
        manager: kv_api.KVCacheManager,
        context: CacheContext,
        cache_id: int,
        scope: ReuseScope,
        root_key: bytes,
        tokens: list[Token],
        path: list[tuple[Block, int]],
        priority: PriorityCallback | None,
        request_stats: RequestStats,
    ) -> None:
        self._manager = manager  # a cache keeps its manager alive
        self._context = context  # all the cache uses of its manager's state (the manager owns it)
        self._tpb = context.tokens_per_block
        self._lcs = context.registry.life_cycles
        self._block_lcs = context.registry.block_life_cycles  # a page per block: attention
        self._ssm_lcs = context.registry.ssm_life_cycles
        self._id = cache_id
        self._reuse_scope = scope
        self._root_key = root_key
        self._priority = priority
        self.stats = request_stats  # feeds the manager's statistics and the request's own
        self._status = KVCacheStatus.SUSPENDED
        self._commit_state = CommitState.ALLOWED
        self._tokens = tokens
        self._history = self._capacity = len(tokens)
        self._blocks: list[CacheBlock] = []
        self._index = [array("i") for _ in self._lcs]
        self._user_buffers: dict[int, memoryview] = {}
        self._stale_scan = [0] * len(self._lcs)  # per life cycle: stale blocks below are cleared
        self._num_reused_tokens = len(tokens)
        # Per SSM life cycle: the request's state (allocated by the first resume), whether it is
        # locked, and the reused snapshot that resume copies into it (the match ends on it).
        self._ssm_state: list[Page | None] = [None] * len(self._lcs)
        self._ssm_locked = [False] * len(self._lcs)
        self._ssm_snapshot: list[Page | None] = [None] * len(self._lcs)
        # Tree pages held besides our own private ones, for blocks we pin (``_commit_block``).
        self._tree_holds: list[Page] = []
        # Sliding-window scratch (``scratch.py``): on by default where configured; per life cycle
        # the shared slots of its scratch blocks (locked while active, freed on suspend).
        self._scratch_on = context.swa_scratch_reuse is not None
        self._scratch_pages: list[list[Page]] = [[] for _ in self._lcs]
        # Priorities first: a failing callback must leave the tree untouched.
        reused = [
            (o, lc, page, self._priority_of(o, lc))
            for o, (block, _) in enumerate(path)
            for lc in self._block_lcs
            if (page := block.pages[lc]) is not None and not self._is_stale(lc, o, self._history)
        ]
        snapshots = [
            (len(path) - 1, lc, page, self._priority_of(len(path) - 1, lc))
            for lc in self._ssm_lcs
            if path and (page := path[-1][0].pages[lc]) is not None
        ]
        for block, matched in path:
            cb = CacheBlock(len(self._lcs))
            if matched == len(block.tokens) == self._tpb:
                cb.tree_block = block
                block.pins += 1
            else:
                cb.copy_on_resume = True  # a reused partial block: never written in place
            self._blocks.append(cb)
            for idx in self._index:
                idx.append(BAD_PAGE_INDEX)
        # Each block's tokens count at the coldest level among its reused pages (0 with none).
        coldest = [0] * len(path)
        for o, _, page, _ in reused + snapshots:
            coldest[o] = max(coldest[o], page.level)
        self._cached_tokens_by_level = [0] * len(self._context.storage.levels)
        for o, (_, matched) in enumerate(path):
            self._cached_tokens_by_level[coldest[o]] += matched
        for o, lc, page, raised in reused:
            self._context.storage.hold(page, raised)  # reuse may raise a block's priority
            self._blocks[o].pages[lc] = page
        for _, lc, page, raised in snapshots:
            self._context.storage.hold(page, raised)
            self._ssm_snapshot[lc] = page

    # -- lengths and state --------------------------------------------------------------------

    @property
    def manager(self) -> kv_api.KVCacheManager:
        poison.check()
        return self._manager

    @property
    def id(self) -> int:
        poison.check()
        return self._id

    @property
    def reuse_scope(self) -> ReuseScope:
        poison.check()
        return self._reuse_scope

    @property
    def num_reused_tokens(self) -> int:
        poison.check()
        return self._num_reused_tokens

    @property
    def cached_tokens_by_level(self) -> list[int]:
        poison.check()
        return list(self._cached_tokens_by_level)

    # -- per-request stats (request_stats.py) ---------------------------------------------------

    @property
    def expected_prompt_length(self) -> int:
        poison.check()
        return self.stats.expected_prompt_length

    @property
    def text_only(self) -> bool:
        poison.check()
        return self.stats.text_only

    def commit_pending_stats(self) -> KVCacheStatsDelta:
        poison.check()
        with self._context.lock:
            return self.stats.commit()

    def discard_pending_stats(self) -> None:
        poison.check()
        with self._context.lock:
            self.stats.discard()

    @property
    def status(self) -> KVCacheStatus:
        poison.check()
        return self._status

    @property
    def is_active(self) -> bool:
        poison.check()
        return self._status == KVCacheStatus.ACTIVE

    @property
    def tokens_per_block(self) -> int:
        poison.check()
        return self._tpb

    @property
    def beam_width(self) -> int:
        poison.check()
        return 1

    @property
    def num_committed_tokens(self) -> int:
        poison.check()
        return len(self._tokens)

    @property
    def committed_tokens(self) -> list[Token]:
        poison.check()
        with self._context.lock:  # a copy of a list a commit on another thread may be extending
            return list(self._tokens)

    @property
    def history_length(self) -> int:
        poison.check()
        return self._history

    @history_length.setter
    def history_length(self, value: int) -> None:
        poison.check()
        self._set_length("history_length", value)

    @property
    def capacity(self) -> int:
        poison.check()
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        poison.check()
        self._set_length("capacity", value)

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

    @property
    def num_blocks(self) -> int:
        poison.check()
        return len(self._blocks)

    def _require(self, status: KVCacheStatus, api: str) -> None:
        if self._status != status:
            raise InvalidStateError(f"{api}() requires a {status.name} cache (status: {self._status.name})")

    # -- pages ----------------------------------------------------------------------------------

    def _priority_of(self, ordinal: int, lc: int) -> int:
        if self._priority is None:
            return DEFAULT_PRIORITY
        value = self._priority(ordinal, self._lcs[lc])
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"custom_priority_callback: expected an int, got {type(value).__name__}")
        if not MIN_PRIORITY <= value <= MAX_PRIORITY:
            raise ValueError(f"custom_priority_callback: {value} is outside [{MIN_PRIORITY}, {MAX_PRIORITY}]")
        return value

    def _set_index(self, ordinal: int, lc: int, value: int) -> None:
        self._index[lc][ordinal] = value
        buf = self._user_buffers.get(lc)
        if buf is not None:
            buf[ordinal] = value

    def _lock_page(self, ordinal: int, lc: int) -> None:
        page = self._blocks[ordinal].pages[lc]
        assert page is not None
        self._context.storage.lock(page)
        self._blocks[ordinal].locked[lc] = True
        self._set_index(ordinal, lc, page.slot)

    def _unlock_page(self, ordinal: int, lc: int) -> None:
        cb = self._blocks[ordinal]
        if cb.locked[lc]:
            page = cb.pages[lc]
            assert page is not None
            self._context.storage.unlock(page)
            cb.locked[lc] = False
            self._set_index(ordinal, lc, BAD_PAGE_INDEX)

    def _release_page(self, ordinal: int, lc: int) -> None:
        page = self._blocks[ordinal].pages[lc]
        if page is not None:
            self._unlock_page(ordinal, lc)
            self._blocks[ordinal].pages[lc] = None
            self._context.storage.unhold(page)

    def _is_stale(self, lc: int, ordinal: int, history: int) -> bool:
        begin, end = self._context.registry.stale_range(lc, history)
        return begin <= ordinal < end

    def _stale_releases(self, history: int) -> list[tuple[int, int, bool]]:
        """Pages of blocks stale at ``history``: ``(ordinal, lc, keep)``; an uncommitted page is
        kept (held, unlocked) while it may still be committed. Starts past the blocks already
        cleared, so a decode step does not rescan the whole history."""
        out = []
        # With commit_min_snapshot a page out of the window is not kept for a commit: the tree
        # only gets the state reusable at the committed length.
        allowed = self._commit_state == CommitState.ALLOWED and not self._context.commit_min_snapshot
        for lc in self._block_lcs:
            begin, end = self._context.registry.stale_range(lc, history)
            for ordinal in range(max(begin, self._stale_scan[lc]), min(end, len(self._blocks))):
                cb = self._blocks[ordinal]
                page = cb.pages[lc]
                if page is None:
                    continue
                # A block already in the tree never takes our page (``_commit_block`` may keep
                # it private), nor does any block once committing stopped: such a page goes.
                keep = allowed and not page.committed and cb.tree_block is None
                if keep and not cb.locked[lc]:
                    continue  # already kept for commit
                out.append((ordinal, lc, keep))
        return out

    def _apply_stale_releases(self, releases: list[tuple[int, int, bool]], history: int) -> None:
        for ordinal, lc, keep in releases:
            if keep:
                self._unlock_page(ordinal, lc)
            else:
                self._release_page(ordinal, lc)
        for lc in self._block_lcs:
            begin, end = self._context.registry.stale_range(lc, history)
            o = max(begin, self._stale_scan[lc])
            while o < min(end, len(self._blocks)) and self._blocks[o].pages[lc] is None:
                o += 1
            self._stale_scan[lc] = o

    def _fits(
        self, needs: list[tuple[int, int]], releases: list[tuple[int, int, bool]], scratch_freed: list[Page]
    ) -> bool:
        """Whether room can be made for ``needs`` once ``releases`` (ordinal, life cycle, keep)
        are applied in order: pages they free, and pages they make evictable (queued first);
        ``scratch_freed`` (private scratch pages) are freed too."""
        storage = self._context.storage
        need = [0] * len(storage.pool_groups)
        for _, lc in needs:
            need[storage.config.pool_group_of(lc)] += 1
        freed = [0] * len(storage.pool_groups)
        for scratch in scratch_freed:
            freed[scratch.pool_group] += 1
        pending: list[Page] = []
        for o, lc, keep in releases:
            cb = self._blocks[o]
            page = cb.pages[lc]
            if page is None:
                continue
            locks = page.locks - cb.locked[lc]
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

    def _new_pages(self, needs: list[tuple[int, int]], priorities: list[int]) -> list[Page]:
        """Pages for ``needs`` (held by this cache, not yet placed); OutOfPagesError if short."""
        pages = self._context.storage.new_pages([(lc, p) for (_, lc), p in zip(needs, priorities, strict=True)])
        self.stats.allocated(needs)
        for page in pages:
            page.holders = 1
        return pages

    def _live_ranges(
        self, lc: int, first: int, num_blocks: int, capacity: int, history: int
    ) -> tuple[range, range, range]:
        """The ordinals of ``[first, num_blocks)`` with a page of their own in a life cycle: below
        its stale range, between it and the scratch range, and above that (a window's stale
        range spans most of a long history; the scratch range lies above it)."""
        begin, end = self._context.registry.stale_range(lc, history)
        a, b = self._scratch_range(lc, capacity, history)
        if a == b:
            a = b = end
        return (
            range(first, min(begin, num_blocks)),
            range(max(end, first), min(a, num_blocks)),
            range(max(b, end, first), num_blocks),
        )

    def _scratch_range(self, lc: int, capacity: int, history: int) -> tuple[int, int]:
        """The life cycle's scratch blocks ``[a, b)`` at these lengths (``a == b``: none)."""
        rule = self._context.scratch[lc]
        if rule is None or not self._scratch_on:
            return 0, 0
        return rule.range(capacity, history)

    def _scratch_need(self, lc: int, capacity: int, history: int) -> int:
        """Scratch slots the life cycle needs at these lengths."""
        rule = self._context.scratch[lc]
        a, b = self._scratch_range(lc, capacity, history)
        return 0 if rule is None or a == b else rule.slots(b - a)

    def _check_scratch_history(self, api: str, capacity: int, history: int) -> None:
        """Scratch blocks leaving the scratch range must be stale at the new history: their data
        was never kept, so no page could take them back. ``ValueError`` otherwise (the history
        moved below ``capacity - max_rewind_len``), before anything changes."""
        if not self._scratch_on:
            return
        num_blocks = ceil_div(capacity, self._tpb)
        for lc in self._block_lcs:
            a, b = self._scratch_range(lc, self._capacity, self._history)
            if a == b:
                continue
            a2, b2 = self._scratch_range(lc, capacity, history)
            leaving = [(a, min(b, a2)), (max(a, b2), b)] if a2 < b2 else [(a, b)]
            begin, end = self._context.registry.stale_range(lc, history)
            for lo, hi in leaving:
                hi = min(hi, num_blocks)
                if lo < hi and (lo < begin or hi > end):
                    raise ValueError(
                        f"{api}: history_length {history} would bring back scratch blocks of layer group {lc}"
                        f" (their data is gone); keep it at least capacity - max_rewind_len"
                    )

    def _missing(self, first: int, num_blocks: int, capacity: int, history: int) -> list[tuple[int, int]]:
        """Non-stale blocks in ``[first, num_blocks)`` without a page, by ordinal then life cycle.
        (Every non-stale block below ``num_blocks`` of an open cache has its pages, so a resize
        only needs to look at the blocks it adds.)"""
        out = [
            (o, lc)
            for lc in self._block_lcs
            for live in self._live_ranges(lc, first, num_blocks, capacity, history)
            for o in live
            if o >= len(self._blocks) or self._blocks[o].pages[lc] is None
        ]
        out.sort()
        return out

    def _may_fit(self, first: int, num_blocks: int, capacity: int, history: int) -> bool:
        """False when the pages blocks ``[first, num_blocks)`` need exceed a pool group's slots:
        counted, not listed, so a request too large for the pool is refused in constant time."""
        storage = self._context.storage
        per_pg = [0] * len(storage.pool_groups)
        for lc in self._block_lcs:
            per_pg[storage.config.pool_group_of(lc)] += sum(
                len(r) for r in self._live_ranges(lc, first, num_blocks, capacity, history)
            ) + max(0, self._scratch_need(lc, capacity, history) - len(self._scratch_pages[lc]))
        return all(n <= pg.num_slots for pg, n in zip(storage.pool_groups, per_pg, strict=True))

    def _new_blocks(self, n: int) -> tuple[list[CacheBlock], array[int]] | None:
        """``n`` empty blocks and their page indices, made before a resize changes anything: a
        block table the host cannot hold is a ``HostOOMError`` with the cache unchanged."""
        if n <= 0:
            return None
        try:
            blocks: list[CacheBlock | None] = [None] * n  # sized at once: a table beyond memory fails here
            for i in range(n):
                blocks[i] = CacheBlock(len(self._lcs))
            return cast(list[CacheBlock], blocks), array("i", [BAD_PAGE_INDEX]) * n
        except MemoryError:
            raise HostOOMError(f"resize: cannot allocate {n} blocks") from None

    # -- state machine ------------------------------------------------------------------------------

    def held_pages(self) -> list[Page]:
        """Every page the cache holds (for the manager's quota resize)."""
        blocks = [page for cb in self._blocks for page in cb.pages if page is not None]
        scratch = [p for pages in self._scratch_pages for p in pages]
        return blocks + [p for p in self._ssm_state + self._ssm_snapshot if p is not None] + self._tree_holds + scratch

    def _to_lock(self) -> list[Page]:
        """The pages ``resume`` locks: held, not stale, not a reused partial block's (copied),
        and the SSM states."""
        return [
            page
            for o, cb in enumerate(self._blocks)
            if not cb.copy_on_resume
            for lc, page in enumerate(cb.pages)
            if page is not None and not self._is_stale(lc, o, self._history)
        ] + [p for p in self._ssm_state if p is not None]

    def _make_room(
        self, level: int, pages: list[Page], needs: list[tuple[int, int]], keep: list[Page] | None = None
    ) -> bool:
        """Room at ``level`` for ``pages`` (this cache's, to move there) and ``needs`` (new
        pages), never evicting ``keep``. False, nothing changed, if short."""
        storage = self._context.storage
        need = [0] * len(storage.pool_groups)
        for page in pages:
            need[page.pool_group] += 1
        for _, lc in needs:
            need[storage.config.pool_group_of(lc)] += 1
        if not any(need):
            return True  # a cached prompt resuming on the device: no set of the pages to keep
        try:
            storage.make_room(level, need, frozenset(id(p) for p in keep or ()))
        except OutOfPagesError:
            return False
        return True

    def resume(self, stream: Any = None) -> bool:
        """SUSPENDED -> ACTIVE. False (nothing changed) when a pool group is above
        ``max_util_for_resume`` or pages run out. Pages on colder levels move up first; the
        first resume copies a reused partial block into private pages, so the tree's pages are
        never written."""
        poison.check()
        with self._context.lock:
            self._require(KVCacheStatus.SUSPENDED, "resume")
            limit = self._context.max_util_for_resume
            if any(pg.utilization() > limit for pg in self._context.storage.pool_groups):
                return False
            copies = [
                (o, lc)
                for o, cb in enumerate(self._blocks)
                if cb.copy_on_resume
                for lc in range(len(self._lcs))
                if cb.pages[lc] is not None
            ]
            # A new SSM state is filed under the block of the next token (for its priority).
            states = [(self._history // self._tpb, lc) for lc in self._ssm_lcs if self._ssm_state[lc] is None]
            needs = copies + self._missing(0, len(self._blocks), self._capacity, self._history) + states
            priorities = [self._priority_of(o, lc) for o, lc in needs]
            # Scratch slots last (ordinal -1: they belong to no block), with the default priority:
            # never committed, they are never evicted.
            scratch = [
                (-1, lc) for lc in self._block_lcs for _ in range(self._scratch_need(lc, self._capacity, self._history))
            ]
            needs += scratch
            priorities += [DEFAULT_PRIORITY] * len(scratch)
            locking = self._to_lock()
            below = [p for p in locking if p.level != GPU_LEVEL]
            if not self._make_room(GPU_LEVEL, below, needs, locking):
                return False
            self._context.storage.move_up(below, GPU_LEVEL)
            new = self._new_pages(needs, priorities)
            storage = self._context.storage
            try:
                for (o, lc), page in zip(needs, new, strict=True):
                    source = None if o < 0 else self._source_of(o, lc)
                    if source is not None:  # copy-on-write of a reused partial block or snapshot
                        storage.copy(source, page)
            except Exception:
                for page in new:  # the cache stays suspended, as it was
                    storage.unhold(page)
                raise
            for (o, lc), page in zip(needs, new, strict=True):
                if o < 0:
                    self._scratch_pages[lc].append(page)
                    storage.lock(page)
                    continue
                source = self._source_of(o, lc)
                if source is not None:
                    storage.unhold(source)
                if self._lcs[lc].ssm:
                    self._ssm_state[lc] = page
                    self._ssm_snapshot[lc] = None
                else:
                    self._blocks[o].pages[lc] = page
            for cb in self._blocks:
                cb.copy_on_resume = False
            for o, cb in enumerate(self._blocks):
                for lc, held in enumerate(cb.pages):
                    if held is not None and not self._is_stale(lc, o, self._history):
                        self._lock_page(o, lc)
            for lc in self._ssm_lcs:
                state = self._ssm_state[lc]
                assert state is not None
                storage.lock(state)
                self._ssm_locked[lc] = True
            self._status = KVCacheStatus.ACTIVE
            return True

    def _source_of(self, ordinal: int, lc: int) -> Page | None:
        """What a page ``resume`` allocates starts as: the reused snapshot for an SSM state, the
        reused partial block's page for a copy, else nothing."""
        return self._ssm_snapshot[lc] if self._lcs[lc].ssm else self._blocks[ordinal].pages[lc]

    def prefetch(self, target_level: int = GPU_LEVEL) -> bool:
        """SUSPENDED only: the pages ``resume`` would lock that sit below ``target_level`` move
        up to it, all or nothing (False, nothing changed, when room cannot be made)."""
        poison.check()
        with self._context.lock:
            self._require(KVCacheStatus.SUSPENDED, "prefetch")
            storage = self._context.storage
            level = int_in_range("target_level", target_level, 0)
            if level > storage.last:
                raise IndexError(f"target_level {level} out of range (0..{storage.last})")
            locking = self._to_lock()
            below = [p for p in locking if p.level > level]
            if not self._make_room(level, below, [], locking):
                return False
            storage.move_up(below, level)
            return True

    def suspend(self) -> None:
        """ACTIVE -> SUSPENDED: pages stay held (so stay reserved) but are unlocked."""
        poison.check()
        with self._context.lock:
            self._require(KVCacheStatus.ACTIVE, "suspend")
            self._suspend_locked()

    def _suspend_locked(self) -> None:
        for o in range(len(self._blocks)):
            for lc in range(len(self._lcs)):
                self._unlock_page(o, lc)
        self._unlock_states()
        for lc in self._block_lcs:
            self._free_scratch(lc, 0)
        self._status = KVCacheStatus.SUSPENDED

    def _free_scratch(self, lc: int, keep: int) -> None:
        """Free the life cycle's scratch slots beyond the first ``keep`` (last first)."""
        pages = self._scratch_pages[lc]
        while len(pages) > keep:
            page = pages.pop()
            self._context.storage.unlock(page)
            self._context.storage.unhold(page)

    def _unlock_states(self) -> None:
        for lc in self._ssm_lcs:
            state = self._ssm_state[lc]
            if self._ssm_locked[lc] and state is not None:
                self._context.storage.unlock(state)
                self._ssm_locked[lc] = False

    def resize(self, capacity: int | None = None, history_length: int | None = None) -> bool:
        """Set capacity and/or history (ACTIVE only). History never decreases and capacity never
        drops below it (``ValueError``). False, with nothing changed, when pages run out."""
        poison.check()
        with self._context.lock:
            self._require(KVCacheStatus.ACTIVE, "resize")
            cap = self._capacity if capacity is None else int_in_range("capacity", capacity, 0, TOKEN_LIMIT)
            hist = (
                self._history
                if history_length is None
                else int_in_range("history_length", history_length, 0, TOKEN_LIMIT)
            )
            if hist < self._history:
                raise ValueError(f"history_length: cannot decrease ({self._history} -> {hist})")
            if cap < hist:
                raise ValueError(f"capacity: {cap} is below history_length {hist}")
            if self._scratch_on and cap != self._capacity:
                # Blocks that were scratch must be stale at the new history (their data is gone),
                # and no token may be skipped.
                assert self._context.swa_scratch_reuse is not None
                low = max(0, self._capacity - self._context.swa_scratch_reuse.max_rewind_len)
                if not low <= hist <= self._capacity:
                    raise ValueError(
                        f"resize: with SWA scratch reuse, a new capacity needs history_length in"
                        f" [{low}, {self._capacity}] (got {hist})"
                    )
            self._check_scratch_history("resize", cap, hist)
            num_blocks = ceil_div(cap, self._tpb)
            for lc, buf in self._user_buffers.items():
                if len(buf) < num_blocks:
                    raise ValueError(f"base page index buffer of layer group {lc} too short: {len(buf)} < {num_blocks}")
            if not self._may_fit(len(self._blocks), num_blocks, cap, hist):
                return False
            releases = self._stale_releases(hist)
            shrink = [(o, lc) for o in range(num_blocks, len(self._blocks)) for lc in range(len(self._lcs))]
            needs = self._missing(len(self._blocks), num_blocks, cap, hist)
            priorities = [self._priority_of(o, lc) for o, lc in needs]
            # Scratch: pages of blocks entering the scratch range go (they hold tokens this step
            # rewrites); slots are added or freed to the new count.
            scratch_drops: list[tuple[int, int, bool]] = []
            scratch_freed: list[Page] = []
            for lc in self._block_lcs:
                a, b = self._scratch_range(lc, cap, hist)
                scratch_drops += [
                    (o, lc, False) for o in range(a, min(b, len(self._blocks))) if self._blocks[o].pages[lc] is not None
                ]
                want = self._scratch_need(lc, cap, hist)
                needs += [(-1, lc)] * max(0, want - len(self._scratch_pages[lc]))
                priorities += [DEFAULT_PRIORITY] * max(0, want - len(self._scratch_pages[lc]))
                scratch_freed += self._scratch_pages[lc][want:]
            applied = (
                [(o, lc, False) for o, lc in reversed(shrink)]
                + [r for r in releases if r[0] < num_blocks]
                + scratch_drops
            )
            if needs and not applied and not scratch_freed:
                # Room made before anything changes: a failing copy leaves the cache as it was.
                if not self._make_room(GPU_LEVEL, [], needs):
                    return False
            elif needs and not self._fits(needs, applied, scratch_freed):
                return False
            grown = self._new_blocks(num_blocks - len(self._blocks))
            for o, lc in reversed(shrink):
                self._release_page(o, lc)
            self._apply_stale_releases([r for r in releases if r[0] < num_blocks], hist)
            for o, lc, _ in scratch_drops:
                self._release_page(o, lc)
            for lc in self._block_lcs:
                self._free_scratch(lc, self._scratch_need(lc, cap, hist))
            del self._blocks[num_blocks:]
            for idx in self._index:
                del idx[num_blocks:]
            if grown is not None:
                blocks, indices = grown
                self._blocks.extend(blocks)
                for idx in self._index:
                    idx.extend(indices)
            self._capacity, self._history = cap, hist
            try:
                new = self._new_pages(needs, priorities)
            except Exception:
                # Making room after this call's releases failed (a copy): the new lengths stay and
                # the cache is suspended; resume() allocates the missing pages.
                self._suspend_locked()
                self._sync_user_buffers()
                raise
            for (o, lc), page in zip(needs, new, strict=True):
                if o < 0:
                    self._scratch_pages[lc].append(page)
                    self._context.storage.lock(page)
                    continue
                self._blocks[o].pages[lc] = page
                self._lock_page(o, lc)
            self._sync_user_buffers()
            return True

    def commit(self, tokens: Any, is_end: bool = False) -> None:
        """Record computed tokens (ACTIVE only); each block they fill enters the radix tree.
        ``is_end`` then calls ``stop_committing()``."""
        poison.check()
        with self._context.lock:
            self._require(KVCacheStatus.ACTIVE, "commit")
            if self._commit_state == CommitState.USER_STOP:
                raise LogicError("Cannot commit tokens after stop_committing()")
            new = Tokens(tokens, self._context.key_format).to_list()
            end = bool(is_end)  # converted before anything changes: a failing __bool__ commits nothing
            if self.stats.text_only and (digest := first_digest(new)) is not None:
                raise text_only_error("tokens", digest)
            if len(self._tokens) + len(new) > self._capacity:
                raise ValueError(
                    f"commit: {len(self._tokens)} committed + {len(new)} new tokens exceed capacity {self._capacity}"
                )
            cms = self._context.commit_min_snapshot
            if cms and self._history not in (len(self._tokens), len(self._tokens) + len(new)):
                raise LogicError(
                    f"commit: with commit_min_snapshot, history_length ({self._history}) must equal the committed"
                    f" tokens before ({len(self._tokens)}) or after ({len(self._tokens) + len(new)}) the commit"
                )
            self._check_scratch_history("commit", self._capacity, max(self._history, len(self._tokens) + len(new)))
            first = len(self._tokens) // self._tpb
            self._tokens.extend(new)
            self._history = max(self._history, len(self._tokens))
            for lc in self._block_lcs:  # a longer history leaves fewer scratch blocks
                self._free_scratch(lc, self._scratch_need(lc, self._capacity, self._history))
            if cms:  # pages out of the window go before their blocks could enter the tree
                self._apply_stale_releases(self._stale_releases(self._history), self._history)
            for ordinal in range(first, len(self._tokens) // self._tpb):
                self._commit_block(ordinal)
            if cms and new and not end:
                self._snapshot(move=False)
            self._apply_stale_releases(self._stale_releases(self._history), self._history)
            if end:
                self._stop_committing_locked(move_state=cms)

    def _parent_node(self, ordinal: int) -> Node | None:
        if ordinal == 0:
            return self._context.tree.root(self._root_key, self.reuse_scope)
        return self._blocks[ordinal - 1].tree_block

    def _commit_block(self, ordinal: int, pages: list[Page | None] | None = None) -> None:
        """Put block ``ordinal`` (full, or the partial tail on stop) into the tree. A block
        already there keeps the pages covering it and ours are given up for them (rebase); ours
        fill the life cycles it lacks or covers only in part. A partial block a sibling extends
        is not added (ours stay private); a new block replaces the partial sibling it extends
        and adopts its pages. Without a parent in the tree the cache stops committing.
        ``pages`` (a partial tail only) replaces the block's own: its snapshot copies, or its
        live pages and SSM state."""
        if self._commit_state == CommitState.VIRTUAL_STOP:
            return
        parent = self._parent_node(ordinal)
        if parent is None:
            self._commit_state = CommitState.VIRTUAL_STOP
            return
        cb = self._blocks[ordinal]
        ours_by_lc = cb.pages if pages is None else pages
        tokens = tuple(self._tokens[ordinal * self._tpb : (ordinal + 1) * self._tpb])
        full = len(tokens) == self._tpb
        key = chained_keys(parent.key, Tokens(tokens, self._context.key_format), 0, 1, self._tpb)[1]
        block = parent.children.get(key)
        if block is None:
            tree = self._context.tree
            if not full and tree.covering_sibling(parent, tokens) is not None:
                return
            shorter = tree.covered_sibling(parent, tokens)
            block = tree.add(parent, key, tokens, ordinal)
            self.stats.committed_block()
            if shorter is not None:
                self._context.storage.adopt(block, shorter)
        for lc in range(len(self._lcs)):
            ours, theirs = ours_by_lc[lc], block.pages[lc]
            if theirs is not None and theirs.num_tokens >= len(tokens):
                if ours is not None and ours is not theirs and full and cb.locked[lc] and theirs.level != GPU_LEVEL:
                    if theirs.holders:
                        # Another cache holds the tree's page and pins the block on it: the page
                        # stays the block's, and we hold it too, so it outlives our pin as well;
                        # ours stays private.
                        self._context.storage.hold(theirs)
                        self._tree_holds.append(theirs)
                    else:
                        # The tree's copy sits on a colder level and ours, locked, is on the
                        # device: ours takes its place (we hold it, so nothing drops the block).
                        self._context.storage.replace(block, lc, ours)
                elif ours is not None and ours is not theirs and full:
                    self._context.storage.hold(theirs)
                    if cb.locked[lc]:
                        self._unlock_page(ordinal, lc)
                        cb.pages[lc] = theirs
                        self._lock_page(ordinal, lc)
                    else:
                        cb.pages[lc] = theirs
                    self._context.storage.unhold(ours)
            elif ours is not None and not ours.committed:
                self._attach(block, lc, ours, len(tokens))
        if cb.tree_block is None and full:
            # Later blocks hang under a full block, so it stays in the tree while we are open (we
            # hold all its pages). A partial tail is the last block: nothing hangs under it, and
            # when it already existed we keep our private page and hold none of its pages.
            cb.tree_block = block
            block.pins += 1
        else:
            self._context.tree.prune(block)  # a new partial block none of our pages went into

    def _attach(self, block: Block, lc: int, page: Page, num_tokens: int) -> None:
        """``page`` (uncommitted) becomes the block's page in ``lc``, valid for ``num_tokens``;
        a page it had covers fewer (an adopted one covering a prefix) and is orphaned."""
        theirs = block.pages[lc]
        if theirs is not None:
            self._context.storage.orphan(theirs)
        page.block = block
        page.num_tokens = num_tokens
        block.pages[lc] = page
        self.stats.attached(lc)
        if self._context.events is not None:
            self._context.events.stored(block, lc, page.priority, page.level)

    def _snapshot(self, move: bool) -> None:
        """commit_min_snapshot: what a request reusing exactly the committed tokens needs enters
        the tree: a partial tail's attention pages and the SSM states, each valid for the tokens
        of its block that are committed. ``move`` gives the live pages (the request ends),
        otherwise copies, made only if room can be (no snapshot else: it is a cache, not state)."""
        n = len(self._tokens)
        if n == 0 or self._commit_state == CommitState.VIRTUAL_STOP:
            return
        states = [(lc, p) for lc in self._ssm_lcs if (p := self._ssm_state[lc]) is not None and not p.committed]
        tail = n % self._tpb
        block = None if tail else self._blocks[n // self._tpb - 1].tree_block
        if tail:
            cb = self._blocks[n // self._tpb]
            if cb.copy_on_resume:
                return  # a reused partial block not copied yet: nothing of ours to snapshot
            live = [(lc, p) for lc in self._block_lcs if (p := cb.pages[lc]) is not None and not p.committed]
            sources = live + states
        elif block is None:
            return
        else:  # the full block is in the tree already: only states it lacks
            sources = [(lc, p) for lc, p in states if (t := block.pages[lc]) is None or t.num_tokens < self._tpb]
        if not sources:
            return
        pages = [p for _, p in sources] if move else self._copies([p for _, p in sources])
        if pages is None:
            self.stats.snapshot_skipped([lc for lc, _ in sources])
            return
        if block is None:
            override: list[Page | None] = [None] * len(self._lcs)
            for (lc, _), page in zip(sources, pages, strict=True):
                override[lc] = page
            self._commit_block(n // self._tpb, override)
        else:
            for (lc, _), page in zip(sources, pages, strict=True):
                self._attach(block, lc, page, self._tpb)
        if not move:
            for page in pages:  # the tree keeps the copies that went in; the others are freed
                self._context.storage.unhold(page)

    def _copies(self, sources: list[Page]) -> list[Page] | None:
        """New device pages holding ``sources``' data (held once each), or None without room."""
        storage = self._context.storage
        try:
            pages = storage.new_pages([(p.life_cycle, p.priority) for p in sources])
        except OutOfPagesError:
            return None
        for page in pages:
            page.holders = 1
        try:
            for src, dst in zip(sources, pages, strict=True):
                storage.copy(src, dst)
        except Exception:
            for page in pages:
                storage.unhold(page)
            raise
        return pages

    def stop_committing(self) -> None:
        """Commit the partial tail block, then accept no more commits. Idempotent."""
        poison.check()
        with self._context.lock:
            self._stop_committing_locked()

    def _stop_committing_locked(self, move_state: bool = False) -> None:
        """``move_state`` (commit_min_snapshot, ``is_end``): the live tail pages and SSM states
        go into the tree, not copies of them."""
        if self._commit_state == CommitState.USER_STOP or self._status == KVCacheStatus.CLOSED:
            return
        tail = len(self._tokens) % self._tpb
        ordinal = len(self._tokens) // self._tpb
        if move_state:
            self._snapshot(move=True)
        elif tail and ordinal < len(self._blocks) and not self._blocks[ordinal].copy_on_resume:
            self._commit_block(ordinal)
        self._commit_state = CommitState.USER_STOP
        self._apply_stale_releases(self._stale_releases(self._history), self._history)

    def plan_committed_block_drop(self) -> planned_drop.PlannedDropHandle | None:
        """A plan to drop the committed tokens' trailing window pages and last SSM snapshot
        (``planned_drop.plan``); ``LogicError`` before ``stop_committing()``."""
        poison.check()
        with self._context.lock:
            if self._commit_state != CommitState.USER_STOP:
                raise LogicError("plan_committed_block_drop() requires stop_committing()")
            return planned_drop.plan(self._context, self._root_key, self._tokens)

    def close(self) -> None:
        """Commit the partial tail, release every page (last block first; committed pages become
        evictable, the others are freed) and unregister. Idempotent."""
        poison.check()
        with self._context.lock:
            if self._status == KVCacheStatus.CLOSED:
                return
            self._stop_committing_locked()
            for o in reversed(range(len(self._blocks))):
                for lc in range(len(self._lcs)):
                    self._release_page(o, lc)
            self._unlock_states()
            for lc in self._block_lcs:
                self._free_scratch(lc, 0)
            for lc in self._ssm_lcs:
                for held in (self._ssm_state, self._ssm_snapshot):
                    page = held[lc]
                    if page is not None:
                        held[lc] = None
                        self._context.storage.unhold(page)
            for page in reversed(self._tree_holds):
                self._context.storage.unhold(page)
            self._tree_holds.clear()
            for cb in reversed(self._blocks):  # blocks left without pages go now
                if cb.tree_block is not None:
                    cb.tree_block.pins -= 1
                    self._context.tree.prune(cb.tree_block)
                    cb.tree_block = None
            self._status = KVCacheStatus.CLOSED
            self._context.unregister_cache(self)
            if not self.stats.excluded:  # mark_stats_excluded: feeds the auto-tuner nothing
                self._context.rebalancer.sample(self._num_reused_tokens, self._capacity, self._history)

    def __del__(self) -> None:
        try:
            # Poisoned, the pages' bookkeeping cannot be trusted: the cache is dropped as it is,
            # its pages go with the manager.
            if self._status != KVCacheStatus.CLOSED and not self._context.is_shut_down and poison.reason() is None:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    # -- page indices -------------------------------------------------------------------------

    def _check_group(self, layer_group: Any, beam: Any) -> int:
        lg = int_in_range("layer_group", layer_group, 0)
        if lg >= len(self._lcs):
            raise IndexError(f"layer_group {lg} out of range (0..{len(self._lcs) - 1})")
        b = int_in_range("beam", beam, 0)
        if b != 0:
            raise IndexError(f"beam {b} out of range (beam width 1)")
        return lg

    def get_base_page_indices(self, layer_group: int, beam: int = 0) -> array[int]:
        """One slot id per block of the layer group, ``BAD_PAGE_INDEX`` where no page is locked."""
        poison.check()
        with self._context.lock:
            return array("i", self._index[self._check_group(layer_group, beam)])

    def get_ssm_block_base_index(self, layer_group: int) -> int:
        poison.check()
        with self._context.lock:
            lg = self._check_group(layer_group, 0)
            state = self._ssm_state[lg]
            return state.slot if state is not None and self._ssm_locked[lg] else BAD_PAGE_INDEX

    def get_page_levels(self, layer_group: int, beam: int = 0) -> array[int]:
        """Per block, the cache level of the cache's page in the layer group (-1: none)."""
        poison.check()
        with self._context.lock:
            lg = self._check_group(layer_group, beam)
            return array("i", [-1 if (p := cb.pages[lg]) is None else p.level for cb in self._blocks])

    def get_aggregated_page_indices(self, layer_group: int, beam: int = 0, valid_only: bool = False) -> array[int]:
        poison.check()
        with self._context.lock:
            idx = self._index[self._check_group(layer_group, beam)]
            return array("i", [i for i in idx if i != BAD_PAGE_INDEX] if valid_only else idx)

    def set_base_page_index_buf(self, beam: int, layer_group: int, buf: Any) -> None:
        """Keep ``buf`` (1-D, writable, format 'i', at least ``num_blocks`` long; a buffer or a
        DLPack tensor such as a torch int32 tensor) updated with the layer group's page indices;
        the tail past ``num_blocks`` is -1. ``None`` detaches."""
        poison.check()
        with self._context.lock:
            lg = self._check_group(layer_group, beam)
            if buf is None:
                self._user_buffers.pop(lg, None)
                return
            view = as_buffer(buf, "buf")
            if view is None:
                raise TypeError(f"buf: expected a writable int32 buffer, got {type(buf).__name__}")
            if view.readonly or view.ndim != 1 or view.format not in ("i", "@i", "=i", "<i"):
                raise ValueError(f"buf: must be a writable 1-D buffer of format 'i' (got format {view.format!r})")
            if not view.c_contiguous:
                raise ValueError("buf: must be contiguous")
            if len(view) < len(self._blocks):
                raise ValueError(f"buf: too short ({len(view)} < {len(self._blocks)} blocks)")
            view = view.cast("B").cast("i")
            self._user_buffers[lg] = view
            self._sync_user_buffers()

    # -- sliding-window scratch ------------------------------------------------------------------

    @property
    def enable_swa_scratch_reuse(self) -> bool:
        poison.check()
        return self._scratch_on

    @enable_swa_scratch_reuse.setter
    def enable_swa_scratch_reuse(self, value: bool) -> None:
        poison.check()
        with self._context.lock:
            if not isinstance(value, bool):
                raise TypeError(f"enable_swa_scratch_reuse: expected a bool, got {type(value).__name__}")
            if value == self._scratch_on:
                return
            if value and self._context.swa_scratch_reuse is None:
                raise ValueError("enable_swa_scratch_reuse: the manager's config has no swa_scratch_reuse")
            # Either way the blocks of the scratch range would change hands (pages <-> scratch).
            on = [
                lc
                for lc in self._block_lcs
                if (rule := self._context.scratch[lc]) is not None
                and (r := rule.range(self._capacity, self._history))[0] < r[1]
            ]
            if on:
                raise ValueError(
                    f"enable_swa_scratch_reuse: cannot change while scratch blocks are needed (layer group {on[0]})"
                )
            self._scratch_on = value

    @property
    def has_scratch_slots(self) -> bool:
        poison.check()
        return any(self._scratch_pages)

    def get_scratch_desc(self, layer_group: int) -> ScratchDesc | None:
        poison.check()
        with self._context.lock:
            lg = self._check_group(layer_group, 0)
            pages = self._scratch_pages[lg]
            if not pages:
                return None
            a, b = self._scratch_range(lg, self._capacity, self._history)
            return ScratchDesc(range(a, b), tuple(p.slot for p in pages))

    def supports_index_mode(self, mode: PageIndexMode) -> bool:
        poison.check()
        with self._context.lock:
            return PageIndexMode(mode) == PageIndexMode.PER_LAYER or not any(self._scratch_pages)

    def _sync_user_buffers(self) -> None:
        for lc, buf in self._user_buffers.items():
            n = len(self._blocks)
            buf[:n] = self._index[lc]
            for i in range(n, len(buf)):
                buf[i] = BAD_PAGE_INDEX
