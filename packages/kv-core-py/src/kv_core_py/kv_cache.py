"""One request's KV cache and its state machine (docs/manager.md, "KV cache"): created on a
matched prefix, resumed, resized, suspended and closed. Its parts live in their own files
(``cache_state``: the fields and page steps; ``page_indices``; ``cache_scratch``;
``cache_room``; ``cache_commit``) and meet here."""

from __future__ import annotations

from array import array
from typing import Any

import kv_api
from kv_api._check import int_in_range
from kv_api.constants import BAD_PAGE_INDEX, DEFAULT_PRIORITY, GPU_LEVEL, KVCacheStatus
from kv_api.contract import PriorityCallback
from kv_api.keys import Token
from kv_api.scope import ReuseScope
from kv_api.stats import KVCacheStatsDelta, ReuseReport
from kv_core_py import poison
from kv_core_py.cache_commit import CacheCommit
from kv_core_py.cache_context import CacheContext
from kv_core_py.cache_resize import CacheResize
from kv_core_py.cache_room import Need
from kv_core_py.cache_state import CacheBlock, CommitState
from kv_core_py.page import Page
from kv_core_py.prompt_keys import PromptKeys
from kv_core_py.radix_tree import Block
from kv_core_py.request_stats import RequestStats
from kv_core_py.reuse_report import Misses


class KVCache(CacheResize, CacheCommit, kv_api.KVCache):
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
        remote_blocks: set[int] = frozenset(),  # type: ignore[assignment]
        misses: Misses | None = None,
    ) -> None:
        self._manager = manager
        self._context = context
        self._tokens_per_block = context.tokens_per_block
        self._life_cycles = context.registry.life_cycles
        self._block_layer_groups = context.registry.block_layer_groups
        self._ssm_layer_groups = context.registry.ssm_layer_groups
        self._id = cache_id
        self._reuse_scope = scope
        self._root_key = root_key
        self._priority = priority
        self.stats = request_stats
        self._status = KVCacheStatus.SUSPENDED
        self._commit_state = CommitState.ALLOWED
        self._tokens = tokens
        self._history = self._capacity = len(tokens)
        self._blocks = []
        num_groups = len(self._life_cycles)
        self._index = [array("i") for _ in range(num_groups)]
        self._user_buffers = {}
        self._stale_scan = [0] * num_groups
        self._num_reused_tokens = len(tokens)
        self._ssm_state = [None] * num_groups
        self._ssm_locked = [False] * num_groups
        self._ssm_snapshot = [None] * num_groups
        self._tree_holds = []
        self._scratch_on = context.swa_scratch_reuse is not None  # on by default where configured
        self._scratch_pages = [[] for _ in range(num_groups)]
        self._hold_matched(path, remote_blocks)
        self._reuse_report = None if misses is None else misses.report(self._cached_tokens_by_level)
        # the report's keys past the match, until a commit fills blocks
        self._prompt_keys = PromptKeys() if misses is None else misses.keys

    def _hold_matched(self, path: list[tuple[Block, int]], remote_blocks: set[int]) -> None:
        """Take the matched prefix: its blocks, and a hold on each reused page."""
        # Priorities first: a failing callback must leave the tree untouched.
        reused = [
            (ordinal, group, page, self._priority_of(ordinal, group))
            for ordinal, (block, _) in enumerate(path)
            for group in self._block_layer_groups
            if (page := block.pages[group]) is not None and not self._is_stale(group, ordinal, self._history)
        ]
        snapshots = [
            (len(path) - 1, group, page, self._priority_of(len(path) - 1, group))
            for group in self._ssm_layer_groups
            if path and (page := path[-1][0].pages[group]) is not None
        ]
        for block, matched in path:
            cache_block = CacheBlock(len(self._life_cycles))
            if matched == len(block.tokens) == self._tokens_per_block:
                cache_block.tree_block = block
                block.pins += 1
            else:
                cache_block.copy_on_resume = True  # a reused partial block: never written in place
            self._blocks.append(cache_block)
            for index in self._index:
                index.append(BAD_PAGE_INDEX)
        # Each block's tokens count at the coldest level among its reused pages (0 with none).
        coldest = [0] * len(path)
        for ordinal, _, page, _ in reused + snapshots:
            coldest[ordinal] = max(coldest[ordinal], page.level)
        remote = self._context.remote
        self._cached_tokens_by_level = [0] * (len(self._context.storage.levels) + (remote is not None))
        for ordinal, (block, matched) in enumerate(path):
            # A block the remote tier brought for this match counts there (the last column).
            level = len(self._context.storage.levels) if id(block) in remote_blocks else coldest[ordinal]
            self._cached_tokens_by_level[level] += matched
        for ordinal, group, page, raised in reused:
            self._context.storage.hold(page, raised)  # reuse may raise a block's priority
            self._blocks[ordinal].pages[group] = page
        for _, group, page, raised in snapshots:
            self._context.storage.hold(page, raised)
            self._ssm_snapshot[group] = page

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

    @property
    def reuse_report(self) -> ReuseReport | None:
        poison.check()
        return self._reuse_report

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
        return self._tokens_per_block

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

    @property
    def num_blocks(self) -> int:
        poison.check()
        return len(self._blocks)

    def held_pages(self) -> list[Page]:
        """Every page the cache holds (for the manager's quota resize)."""
        blocks = [page for cache_block in self._blocks for page in cache_block.pages if page is not None]
        scratch = [p for pages in self._scratch_pages for p in pages]
        states = [p for p in self._ssm_state + self._ssm_snapshot if p is not None]
        return blocks + states + self._tree_holds + scratch

    # -- resume, prefetch, suspend --------------------------------------------------------------

    def resume(self, stream: Any = None) -> bool:
        """SUSPENDED -> ACTIVE. False (nothing changed) when a pool group is above
        ``max_util_for_resume`` or pages run out. Pages on colder levels move up first; the
        first resume copies a reused partial block into private pages, so the tree's pages are
        never written."""
        poison.check()
        with self._context.lock:
            self._require(KVCacheStatus.SUSPENDED, "resume")
            storage = self._context.storage
            limit = self._context.max_util_for_resume
            if any(pg.utilization() > limit for pg in storage.pool_groups):
                return False
            needs, priorities = self._resume_needs()
            locking = self._to_lock()
            below = [p for p in locking if p.level != GPU_LEVEL]
            if not self._make_room(GPU_LEVEL, below, needs, locking):
                return False
            storage.move_up(below, GPU_LEVEL)
            new = self._new_pages(needs, priorities)
            try:
                for (ordinal, group), page in zip(needs, new, strict=True):
                    source = None if ordinal < 0 else self._source_of(ordinal, group)
                    if source is not None:  # copy-on-write of a reused partial block or snapshot
                        storage.copy(source, page)
            except Exception:
                for page in new:  # the cache stays suspended, as it was
                    storage.unhold(page)
                raise
            self._place_resumed(needs, new)
            self._status = KVCacheStatus.ACTIVE
            return True

    def _resume_needs(self) -> tuple[list[Need], list[int]]:
        """The pages a resume allocates, and their priorities: copies of reused partial blocks,
        missing blocks, new SSM states, then scratch slots."""
        copies = [
            (ordinal, group)
            for ordinal, cache_block in enumerate(self._blocks)
            if cache_block.copy_on_resume
            for group in range(len(self._life_cycles))
            if cache_block.pages[group] is not None
        ]
        # A new SSM state is filed under the block of the next token (for its priority).
        next_block = self._history // self._tokens_per_block
        states = [(next_block, group) for group in self._ssm_layer_groups if self._ssm_state[group] is None]
        needs = copies + self._missing(0, len(self._blocks), self._capacity, self._history) + states
        priorities = [self._priority_of(ordinal, group) for ordinal, group in needs]
        # Scratch slots last, with the default priority: never committed, they are never evicted.
        scratch = self._scratch_needs(self._capacity, self._history)
        return needs + scratch, priorities + [DEFAULT_PRIORITY] * len(scratch)

    def _place_resumed(self, needs: list[Need], new: list[Page]) -> None:
        """Put a resume's new pages in place, then lock every page the active cache uses."""
        storage = self._context.storage
        for (ordinal, group), page in zip(needs, new, strict=True):
            if ordinal < 0:
                self._scratch_pages[group].append(page)
                storage.lock(page)
                continue
            source = self._source_of(ordinal, group)
            if source is not None:
                storage.unhold(source)
            if not self._context.registry.kinds[group].has_block_pages:
                self._ssm_state[group] = page
                self._ssm_snapshot[group] = None
            else:
                self._blocks[ordinal].pages[group] = page
        for cache_block in self._blocks:
            cache_block.copy_on_resume = False
        for ordinal, cache_block in enumerate(self._blocks):
            for group, held in enumerate(cache_block.pages):
                if held is not None and not self._is_stale(group, ordinal, self._history):
                    self._lock_page(ordinal, group)
        for group in self._ssm_layer_groups:
            state = self._ssm_state[group]
            assert state is not None
            storage.lock(state)
            self._ssm_locked[group] = True

    def _source_of(self, ordinal: int, layer_group: int) -> Page | None:
        """What a page ``resume`` allocates starts as: the reused snapshot for an SSM state, the
        reused partial block's page for a copy, else nothing."""
        if not self._context.registry.kinds[layer_group].has_block_pages:
            return self._ssm_snapshot[layer_group]
        return self._blocks[ordinal].pages[layer_group]

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

    # -- close ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Commit the partial tail, release every page (last block first; committed pages become
        evictable, the others are freed) and unregister. Idempotent."""
        poison.check()
        with self._context.lock:
            if self._status == KVCacheStatus.CLOSED:
                return
            self._close_locked()
            remote = self._context.remote
            if remote is not None:  # a request's blocks are in the store once it closes
                remote.flush()
                remote.hand()

    def _close_dropped(self) -> None:
        """``close`` for a cache its owner dropped (the finaliser): the store is not handed what
        is staged (a finaliser may run inside the store's own code, its lock held); the next
        close does it."""
        poison.check()
        with self._context.lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._status == KVCacheStatus.CLOSED:
            return
        self._stop_committing_locked()
        for ordinal in reversed(range(len(self._blocks))):
            for group in range(len(self._life_cycles)):
                self._release_page(ordinal, group)
        self._unlock_states()
        for group in self._block_layer_groups:
            self._free_scratch(group, 0)
        for group in self._ssm_layer_groups:
            for held in (self._ssm_state, self._ssm_snapshot):
                page = held[group]
                if page is not None:
                    held[group] = None
                    self._context.storage.unhold(page)
        for page in reversed(self._tree_holds):
            self._context.storage.unhold(page)
        self._tree_holds.clear()
        for cache_block in reversed(self._blocks):  # blocks left without pages go now
            if cache_block.tree_block is not None:
                cache_block.tree_block.pins -= 1
                self._context.tree.prune(cache_block.tree_block)
                cache_block.tree_block = None
        self._status = KVCacheStatus.CLOSED
        self._context.unregister_cache(self)
        if not self.stats.excluded:  # mark_stats_excluded: feeds the auto-tuner nothing
            self._context.rebalancer.sample(self._num_reused_tokens, self._capacity, self._history)

    def __del__(self) -> None:
        try:
            # Poisoned, the pages' bookkeeping cannot be trusted: the cache is dropped as it is,
            # its pages go with the manager.
            if self._status != KVCacheStatus.CLOSED and not self._context.is_shut_down and poison.reason() is None:
                self._close_dropped()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass
