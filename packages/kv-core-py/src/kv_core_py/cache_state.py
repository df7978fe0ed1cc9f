"""What one request's cache holds (its blocks, pages, lengths and commit state) and the page steps
every part of the cache takes: lock, unlock, release, priority. The parts build on it:
``page_indices`` (the index views), ``cache_scratch`` (sliding-window scratch), ``cache_room``
(what a step needs and whether it fits), ``cache_commit`` (into the radix tree) and ``kv_cache``
(the state machine). Every method here expects the manager's lock held (``CacheContext.lock``)."""

from __future__ import annotations

import enum
from array import array
from typing import Any

import kv_api
from kv_api._check import int_in_range
from kv_api.constants import BAD_PAGE_INDEX, DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY, KVCacheStatus
from kv_api.contract import PriorityCallback
from kv_api.descriptors import LifeCycle
from kv_api.errors import InvalidStateError
from kv_api.keys import Token
from kv_api.scope import ReuseScope
from kv_core_py.cache_context import CacheContext
from kv_core_py.page import Page
from kv_core_py.prompt_keys import PromptKeys
from kv_core_py.radix_tree import Block
from kv_core_py.request_stats import RequestStats


class CommitState(enum.IntEnum):
    ALLOWED = 0
    USER_STOP = 1  # stop_committing() or close(): the partial tail was committed
    VIRTUAL_STOP = 2  # a block could not enter the tree; later tokens are only recorded


class CacheBlock:
    """One block ordinal of one cache: a page per layer group (None when stale or dropped)."""

    __slots__ = ("copy_on_resume", "locked", "pages", "tree_block")

    def __init__(self, num_layer_groups: int) -> None:
        self.pages: list[Page | None] = [None] * num_layer_groups
        self.locked = [False] * num_layer_groups
        self.tree_block: Block | None = None  # the tree block once this block is committed
        self.copy_on_resume = False  # pages are a reused partial block's, shared with the tree


class CacheState:
    """The fields of one cache, set by ``KVCache.__init__``, and the page steps on them."""

    _manager: kv_api.KVCacheManager  # a cache keeps its manager alive
    _context: CacheContext  # all the cache uses of its manager's state (the manager owns it)
    _tokens_per_block: int
    _life_cycles: list[LifeCycle]  # per layer group, its life cycle (what priority callbacks see)
    _block_layer_groups: list[int]  # layer groups with a page per block: attention
    _ssm_layer_groups: list[int]
    _id: int
    _reuse_scope: ReuseScope
    _root_key: bytes
    _priority: PriorityCallback | None
    stats: RequestStats  # feeds the manager's statistics and the request's own
    _status: KVCacheStatus
    _commit_state: CommitState
    _tokens: list[Token]
    _history: int
    _capacity: int
    _blocks: list[CacheBlock]
    _index: list[array[int]]  # per layer group, the slot of each block's locked page
    _user_buffers: dict[int, memoryview]  # per layer group, a caller's buffer mirroring _index
    _stale_scan: list[int]  # per layer group: stale blocks below are cleared
    _num_reused_tokens: int
    _cached_tokens_by_level: list[int]
    _prompt_keys: PromptKeys  # the reuse report's keys past the match, until a commit fills blocks
    # Per SSM layer group: the request's state (allocated by the first resume), whether it is
    # locked, and the reused snapshot that resume copies into it (the match ends on it).
    _ssm_state: list[Page | None]
    _ssm_locked: list[bool]
    _ssm_snapshot: list[Page | None]
    _tree_holds: list[Page]  # tree pages held besides our own private ones, for blocks we pin
    # Sliding-window scratch (``cache_scratch``): on or off, and per layer group the shared slots
    # of its scratch blocks (locked while active, freed on suspend).
    _scratch_on: bool
    _scratch_pages: list[list[Page]]

    def _require(self, status: KVCacheStatus, api: str) -> None:
        if self._status != status:
            raise InvalidStateError(f"{api}() requires a {status.name} cache (status: {self._status.name})")

    def _check_group(self, layer_group: Any, beam: Any) -> int:
        checked = int_in_range("layer_group", layer_group, 0)
        if checked >= len(self._life_cycles):
            raise IndexError(f"layer_group {checked} out of range (0..{len(self._life_cycles) - 1})")
        b = int_in_range("beam", beam, 0)
        if b != 0:
            raise IndexError(f"beam {b} out of range (beam width 1)")
        return checked

    def _priority_of(self, ordinal: int, layer_group: int) -> int:
        if self._priority is None:
            return DEFAULT_PRIORITY
        value = self._priority(ordinal, self._life_cycles[layer_group])
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"custom_priority_callback: expected an int, got {type(value).__name__}")
        if not MIN_PRIORITY <= value <= MAX_PRIORITY:
            raise ValueError(f"custom_priority_callback: {value} is outside [{MIN_PRIORITY}, {MAX_PRIORITY}]")
        return value

    def _set_index(self, ordinal: int, layer_group: int, value: int) -> None:
        self._index[layer_group][ordinal] = value
        buf = self._user_buffers.get(layer_group)
        if buf is not None:
            buf[ordinal] = value

    def _lock_page(self, ordinal: int, layer_group: int) -> None:
        page = self._blocks[ordinal].pages[layer_group]
        assert page is not None
        self._context.storage.lock(page)
        self._blocks[ordinal].locked[layer_group] = True
        self._set_index(ordinal, layer_group, page.slot)

    def _unlock_page(self, ordinal: int, layer_group: int) -> None:
        cache_block = self._blocks[ordinal]
        if cache_block.locked[layer_group]:
            page = cache_block.pages[layer_group]
            assert page is not None
            self._context.storage.unlock(page)
            cache_block.locked[layer_group] = False
            self._set_index(ordinal, layer_group, BAD_PAGE_INDEX)

    def _release_page(self, ordinal: int, layer_group: int) -> None:
        page = self._blocks[ordinal].pages[layer_group]
        if page is not None:
            self._unlock_page(ordinal, layer_group)
            self._blocks[ordinal].pages[layer_group] = None
            self._context.storage.unhold(page)

    def _is_stale(self, layer_group: int, ordinal: int, history: int) -> bool:
        begin, end = self._context.registry.stale_range(layer_group, history)
        return begin <= ordinal < end

    def _unlock_states(self) -> None:
        for layer_group in self._ssm_layer_groups:
            state = self._ssm_state[layer_group]
            if self._ssm_locked[layer_group] and state is not None:
                self._context.storage.unlock(state)
                self._ssm_locked[layer_group] = False
