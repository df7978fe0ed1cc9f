"""KV-cache events for KV-aware routers (docs/manager.md, "Events").

Stored events are per layer group (``layer_group_id``) and merge while they extend the same
chain; Removed hashes are buffered per layer group and flushed, each as one event, before any
other event and at ``flush_iteration_events``. Ids are given when an event is queued (a
Removed event when it is flushed). ``flush_iteration_events`` moves queued events to a ring
of ``max_kv_event_entries``; ``get_latest_events`` drains it.

A ring that would overflow loses nothing silently: its events and the queued ones are dropped
(counted in ``dropped_events``) and replaced by a resync, ``Created`` (a router clears what it
knew) then one ``Stored`` per announced chain of the tree as it is now, however long.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, cast

import kv_api
from kv_api._check import int_in_range
from kv_api._check import timeout_ms as check_timeout
from kv_api.constants import EVENT_ENTRIES_LIMIT
from kv_api.events import (
    HASH_ALGOS,
    BlockHash,
    Created,
    Diff,
    KVCacheEvent,
    Removed,
    Stored,
    StoredBlock,
    UniqueToken,
    Updated,
)
from kv_core_py import poison
from kv_core_py.event_hash import block_hash_v1, block_hash_v2_sha256, block_hash_v2_sha256_64
from kv_core_py.radix_tree import Block, Node, Root


def check_event_args(max_kv_event_entries: Any, hash_algo: Any) -> tuple[int, str]:
    """The ring size and the hash algorithm, checked left to right."""
    entries = int_in_range("max_kv_event_entries", max_kv_event_entries, -EVENT_ENTRIES_LIMIT, EVENT_ENTRIES_LIMIT)
    if not isinstance(hash_algo, str):
        raise TypeError(f"hash_algo: expected a str, got {type(hash_algo).__name__}")
    algo = "v1_block_key" if hash_algo == "auto" else hash_algo
    if algo not in HASH_ALGOS:
        raise ValueError(
            f"hash_algo: Unsupported V2 KV cache event hash algorithm: {hash_algo!r} "
            f"(expected auto, {', '.join(HASH_ALGOS)})"
        )
    return entries, algo


class KVCacheEventManager(kv_api.KVCacheEventManager):
    def __init__(self, max_kv_event_entries: int = 1000, hash_algo: str = "v2_sha256") -> None:
        poison.check()
        entries, self._hash_algo = check_event_args(max_kv_event_entries, hash_algo)
        self._max_kv_event_entries = entries
        self._ring: deque[KVCacheEvent] = deque()
        self._pending: list[KVCacheEvent] = []
        self._removed: dict[int, list[BlockHash]] = {}
        self._stored: set[tuple[bytes, int]] = set()
        self._next_id = 0
        self._windows: list[int | None] = []
        self._cond = threading.Condition()
        self._bound = False
        self._resync: Callable[[], bool] | None = None  # the manager's: False once it is gone
        self._dropped = 0

    # -- public (each checks the poison latch first) ----------------------------------------

    @property
    def hash_algo(self) -> str:
        poison.check()
        return self._hash_algo

    @property
    def max_kv_event_entries(self) -> int:
        poison.check()
        return self._max_kv_event_entries

    @property
    def dropped_events(self) -> int:
        """Events dropped from a full ring (each overflow is followed by a resync)."""
        poison.check()
        with self._cond:
            return self._dropped

    def flush_iteration_events(self) -> None:
        poison.check()
        with self._cond:
            self._flush_removed()
            if self._max_kv_event_entries <= 0:
                self._pending.clear()
                return
            if len(self._ring) + len(self._pending) <= self._max_kv_event_entries:
                self._ring.extend(self._pending)
                self._pending.clear()
                self._cond.notify_all()
                return
            resync = self._resync
        # The manager's lock, then this one: the order its hooks take them in.
        if resync is not None and resync():
            return
        with self._cond:  # no manager to resync from: the oldest drop, counted
            self._ring.extend(self._pending)
            self._pending.clear()
            while len(self._ring) > self._max_kv_event_entries:
                self._ring.popleft()
                self._dropped += 1
            self._cond.notify_all()

    def get_latest_events(self, timeout_ms: float | None = 0) -> list[KVCacheEvent]:
        """Drain the published events; ``None`` waits for some, ``> 0`` waits that long at most."""
        poison.check()
        timeout = check_timeout("timeout_ms", timeout_ms)
        with self._cond:
            if not self._ring and (timeout is None or timeout > 0):
                self._cond.wait_for(lambda: bool(self._ring), None if timeout is None else timeout / 1000)
            events = list(self._ring)
            self._ring.clear()
            return events

    # -- hooks the manager calls --------------------------------------------------------------

    def bind(self, windows: list[int | None], resync: Callable[[], bool] | None = None) -> None:
        """``resync`` runs ``resync_to`` under the manager's lock when the ring would overflow
        (False: the manager is gone)."""
        if self._bound:
            raise ValueError("event_manager: already used by another KVCacheManager")
        self._bound = True
        self._windows = windows
        self._resync = resync

    def resync_to(self, num_blocks_per_cache_level: tuple[int, ...], roots: list[Root]) -> None:
        """With the manager's lock held: drop the ring and the queued events (counted), then
        publish ``Created`` and the announced pages of the tree under ``roots``, per layer group,
        parent before child, siblings in key order (so every backend sends the same)."""
        with self._cond:
            self._flush_removed()
            self._dropped += len(self._ring) + len(self._pending)
            self._ring.clear()
            self._pending.clear()
            self._queue(Created(num_blocks_per_cache_level), None)
            for group in range(len(self._windows)):
                for block in _blocks_in_key_order(roots):
                    page = block.pages[group]
                    if page is not None and (block.key, group) in self._stored:
                        self._append_stored(block, group, page.priority, page.level)
            self._ring.extend(self._pending)
            self._pending.clear()
            self._cond.notify_all()

    def created(self, num_blocks_per_cache_level: tuple[int, ...]) -> None:
        self._queue(Created(num_blocks_per_cache_level), None)

    def stored(self, block: Block, layer_group: int, priority: int, cache_level: int = 0) -> None:
        if (block.key, layer_group) in self._stored:
            return
        self._stored.add((block.key, layer_group))
        with self._cond:
            self._flush_removed()
            self._append_stored(block, layer_group, priority, cache_level)

    def _append_stored(self, block: Block, layer_group: int, priority: int, cache_level: int) -> None:
        """With the lock held: ``block`` stored, merged into the last queued event where it
        extends that event's chain in the same layer group."""
        parent = block.parent
        parent_hash = self._hash(parent) if isinstance(parent, Block) else None
        tokens = tuple(UniqueToken(t.hex() if isinstance(t, bytes) else t) for t in block.tokens)
        new = StoredBlock(self._hash(block), tokens, cache_level, priority, lora_id=block.lora_id)
        last = self._pending[-1] if self._pending else None
        if (
            last is not None
            and isinstance(last.data, Stored)
            and last.layer_group_id == layer_group
            and last.data.blocks[-1].block_hash == parent_hash
        ):
            merged = Stored(last.data.parent_hash, (*last.data.blocks, new))
            self._pending[-1] = KVCacheEvent(
                last.event_id, merged, last.window_size, self._hash_algo, None, layer_group
            )
            return
        self._queue(Stored(parent_hash, (new,)), layer_group)

    def removed(self, block: Block, layer_group: int) -> None:
        if (block.key, layer_group) not in self._stored:
            return  # never announced, nothing to retract
        self._stored.discard((block.key, layer_group))
        with self._cond:
            self._removed.setdefault(layer_group, []).append(self._hash(block))

    def updated(self, block: Block, layer_group: int, old_level: int, new_level: int) -> None:
        """A page of an announced block moved between cache levels."""
        if (block.key, layer_group) in self._stored:
            self._queue(Updated(self._hash(block), cache_level=Diff(old_level, new_level)), layer_group)

    # -- internals ------------------------------------------------------------------------------

    def _queue(self, data: Any, layer_group: int | None) -> None:
        with self._cond:
            self._flush_removed()
            window = self._windows[layer_group] if layer_group is not None else None
            self._pending.append(KVCacheEvent(self._next_id, data, window, self._hash_algo, None, layer_group))
            self._next_id += 1

    def _flush_removed(self) -> None:
        removed, self._removed = self._removed, {}
        for group, hashes in removed.items():
            self._pending.append(
                KVCacheEvent(self._next_id, Removed(tuple(hashes)), self._windows[group], self._hash_algo, None, group)
            )
            self._next_id += 1

    def _hash(self, block: Block) -> BlockHash:
        if self._hash_algo == "v2_sha256":
            return block_hash_v2_sha256(block.key)
        if self._hash_algo == "v2_sha256_64":
            return block_hash_v2_sha256_64(block.key)
        return self._v1(block)

    def _v1(self, block: Block) -> int:
        """Legacy 64-bit hash, chained from the root; a block with a digest token, and every
        descendant, falls back to ``v2_sha256_64``. Cached per block as ``(hash, fell_back)``."""
        chain: list[Block] = []
        node: Node | None = block
        while isinstance(node, Block) and node.v1_hash is None:
            chain.append(node)
            node = node.parent
        if isinstance(node, Block):
            assert node.v1_hash is not None
            parent_hash, fell_back = node.v1_hash
        else:
            parent_hash, fell_back = 0, False
        while not isinstance(node, Root):
            assert node is not None
            node = node.parent
        for b in reversed(chain):
            if fell_back or any(isinstance(t, bytes) for t in b.tokens):
                parent_hash, fell_back = block_hash_v2_sha256_64(b.key), True
            else:
                parent_hash = block_hash_v1(cast(tuple[int, ...], b.tokens), parent_hash, node.scope)
            b.v1_hash = (parent_hash, fell_back)
        assert block.v1_hash is not None
        return block.v1_hash[0]


def _blocks_in_key_order(roots: list[Root]) -> Iterator[Block]:
    """Every block under ``roots``, parent before child, roots and siblings in key order."""
    stack: list[Node] = sorted(roots, key=lambda r: r.key, reverse=True)
    while stack:
        node = stack.pop()
        if isinstance(node, Block):
            yield node
        stack.extend(sorted(node.children.values(), key=lambda b: b.key, reverse=True))
