"""The remote tier (docs/store.md): a match that ends locally continues in a ``kv_api.BlockStore``
and what it finds enters the tree on the last local level; committed full blocks are written
through. Every value is checked before it is used; every store fault is a miss, counted."""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

from kv_api.block_value import (
    encode_value,
    header_size,
    layout_fingerprint,
    payload_ok,
    read_header,
    store_namespace,
)
from kv_api.config import KVCacheManagerConfig, RemoteCacheTierConfig
from kv_api.constants import DEFAULT_PRIORITY
from kv_api.errors import DiskOOMError, OutOfPagesError
from kv_api.store_keys import StoreKeys
from kv_core_py.event_manager import KVCacheEventManager
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.page import Page
from kv_core_py.radix_tree import Block, Node, RadixTree
from kv_core_py.storage import Storage

AddStats = Callable[..., None]

#: What ``flush`` stages before it hands the store a put (remote_tier.cc's twins).
HAND_BLOCKS = 16
HAND_BYTES = 1 << 20


class RemoteTier:
    def __init__(
        self,
        tier: RemoteCacheTierConfig,
        config: KVCacheManagerConfig,
        registry: LifeCycleRegistry,
        storage: Storage,
        tree: RadixTree,
        events: KVCacheEventManager | None,
        add_stats: AddStats,
    ) -> None:
        self.store = tier.store
        self.namespace = store_namespace(tier.model_id, tier.revision, config)
        self.fingerprint = layout_fingerprint(config)
        self.tokens_per_block = config.tokens_per_block
        self.registry = registry
        self.storage = storage
        self.tree = tree
        self.events = events
        self.add_stats = add_stats
        self.level = storage.last  # where the blocks it brings land
        self.page_sizes = [
            storage.levels[0].pool_groups[storage.config.pool_group_of(g)].slot_bytes
            for g in range(len(registry.life_cycles))
        ]
        self.header = header_size(len(self.page_sizes))
        self.value_size = self.header + sum(self.page_sizes)
        self.pending: list[Block] = []  # full blocks that entered the tree in this call, to write
        self.staged_keys: list[bytes] = []  # store keys and values staged for the next put
        self.staged_values: list[bytes] = []
        self.batches = 0  # begin_batch() calls not ended: flush() waits
        self.paused_until = 0.0  # the store's pause (put's answer), on the monotonic clock

    # -- reading -------------------------------------------------------------------------------------

    def fetch(
        self,
        parent: Node | None,
        parent_key: bytes,
        keys: Sequence[bytes],
        first: int,
        tokens: Sequence[Any],
        keep: set[int],
        new_root: Callable[[], Node],
    ) -> list[Block]:
        """Blocks ``first, first + 1, ...`` (keys ``keys``, ``tokens`` their tokens, block by
        block) from the store, placed on the last local level and added under ``parent``
        (``new_root()`` when None): the consecutive ones the store has and whose values pass
        every check. ``keep``: ids of pages making room must not evict (the local match)."""
        self.add_stats(remote_lookups=1)
        digests = b"".join(keys)
        n = self._call_count("contains", StoreKeys(self.namespace, digests))
        if n == 0:
            return []
        size = self.value_size
        buffer = bytearray(n * size)
        views = [memoryview(buffer)[i * size : (i + 1) * size] for i in range(n)]
        got = self._call_count("get_into", StoreKeys(self.namespace, digests[: n * len(keys[0])]), views)
        accepted = 0
        previous = parent_key
        for i in range(got):
            if not self._valid(views[i], keys[i], previous, first + i):
                self.add_stats(remote_rejected=1)
                break
            if not self._complete(views[i], first + i):
                break
            previous = keys[i]
            accepted += 1
        if accepted == 0:
            return []
        placed = self._place(buffer, first, accepted, keep)
        if not placed:
            return []
        node = new_root() if parent is None else parent
        blocks = []
        for i in range(len(placed)):
            node = self._add(node, keys[i], tuple(tokens[i]), first + i, placed[i])
            blocks.append(node)
        self.add_stats(remote_blocks=len(blocks))
        return blocks

    def _call_count(self, method: str, *args: Any) -> int:
        """A store call answering a count in ``[0, len(args[0])]``; a raise or anything else is 0."""
        try:
            n = operator.index(getattr(self.store, method)(*args))
        except Exception:  # noqa: BLE001 - a store is a cache: its faults are misses
            n = -1
        if not 0 <= n <= len(args[0]):
            self.add_stats(remote_errors=1)
            return 0
        return n

    def _valid(self, value: memoryview, key: bytes, parent: bytes, ordinal: int) -> bool:
        header = read_header(value)
        if header is None or len(header.lengths) != len(self.page_sizes):
            return False
        if header.fingerprint != self.fingerprint or header.key != key or header.parent != parent:
            return False
        if header.num_tokens != self.tokens_per_block or header.prefix_tokens != (ordinal + 1) * self.tokens_per_block:
            return False
        if any(n not in (0, size) for n, size in zip(header.lengths, self.page_sizes, strict=True)):
            return False
        return payload_ok(value, header)

    def _complete(self, value: memoryview, ordinal: int) -> bool:
        """Whether the value has a page in every layer group whose loss would cut the chain there."""
        header = read_header(value)
        assert header is not None
        kinds = self.registry.kinds
        return all(n or not kinds[g].drop_takes_subtree(ordinal) for g, n in enumerate(header.lengths))

    def _kept(self, buffer: bytearray, first: int, count: int) -> list[list[bool]]:
        """Per value of the first ``count``, which layer groups' pages to bring: every page a
        chain needs (``drop_takes_subtree``) and the others not stale at the last block's end
        (window pages before the window, SSM snapshots before the last block are no use)."""
        end = (first + count) * self.tokens_per_block
        kinds = self.registry.kinds
        stale = [self.registry.stale_range(g, end) for g in range(len(kinds))]
        kept = []
        for i in range(count):
            header = read_header(memoryview(buffer)[i * self.value_size :])
            assert header is not None
            ordinal = first + i
            kept.append(
                [
                    bool(n)
                    and (kinds[g].drop_takes_subtree(ordinal) or not stale[g][0] <= ordinal < stale[g][1])
                    and (kinds[g].has_block_pages or i == count - 1)
                    for g, n in enumerate(header.lengths)
                ]
            )
        return kept

    def _place(self, buffer: bytearray, first: int, count: int, keep: set[int]) -> list[list[Page | None]]:
        """Pages on the last local level holding the pages ``_kept`` says of the first values:
        as many values as room can be made for without evicting ``keep`` (halving), none where
        the level fails (a miss, counted)."""
        storage = self.storage
        while count:
            kept = self._kept(buffer, first, count)
            need = [0] * len(storage.pool_groups)
            for row in kept:
                for g, wanted in enumerate(row):
                    need[storage.config.pool_group_of(g)] += wanted
            try:
                storage.make_room(self.level, need, keep)
            except OutOfPagesError:
                count //= 2
                continue
            return self._fill(buffer, kept, need)
        return []

    def _fill(self, buffer: bytearray, kept: list[list[bool]], need: list[int]) -> list[list[Page | None]]:
        """New pages on the last local level (room made) for the ``kept`` pages, their bytes copied in."""
        storage, level = self.storage, self.level
        slots = [storage.levels[level].pool_groups[pg].allocate(k) for pg, k in enumerate(need)]
        handed = [iter(s) for s in slots]
        pages: list[list[Page | None]] = []
        copies: list[tuple[int, int, int]] = []
        for i, row in enumerate(kept):
            offset = i * self.value_size + self.header
            placed: list[Page | None] = []
            for g, wanted in enumerate(row):
                page = None
                if wanted:
                    pg = storage.config.pool_group_of(g)
                    page = Page(next(handed[pg]), g, pg, DEFAULT_PRIORITY)
                    page.level = level
                    copies.append((pg, page.slot, offset))
                placed.append(page)
                offset += self.page_sizes[g]
            pages.append(placed)
        try:
            storage.transfer.import_(level, copies, buffer)
        except BaseException as exc:  # the new slots go back whatever failed
            for placed in pages:
                for page in placed:
                    if page is not None:
                        storage.free(page)
            if not isinstance(exc, (OSError, DiskOOMError)):
                raise  # the page copier's error, as any move's
            self.add_stats(remote_errors=1)
            return []
        return pages

    def _add(self, parent: Node, key: bytes, tokens: tuple[Any, ...], ordinal: int, pages: list[Page | None]) -> Block:
        """A tree block for a value's pages (a partial sibling it extends gives way to it)."""
        shorter = self.tree.covered_sibling(parent, tokens)
        block = self.tree.add(parent, key, tokens, ordinal)
        if shorter is not None:
            self.storage.adopt(block, shorter)
        for g, page in enumerate(pages):
            if page is None:
                continue
            old = block.pages[g]
            if old is not None:
                self.storage.orphan(old)
            page.block = block
            page.num_tokens = self.tokens_per_block
            block.pages[g] = page
            self.storage.settle(page)
            if self.events is not None:
                self.events.stored(block, g, page.priority, page.level)
        return block

    # -- writing -------------------------------------------------------------------------------------

    def begin_batch(self) -> None:
        self.batches += 1

    def end_batch(self) -> None:
        self.batches -= 1
        self.flush()

    def flush(self) -> None:
        """Stage this call's new full blocks, their bytes copied and encoded now, and hand the
        store what is staged (one ``put``) once that is ``HAND_BLOCKS`` blocks or ``HAND_BYTES``
        bytes (a decode's one block a put cost the engine's thread a store call each); between
        ``begin_batch`` and ``end_batch`` (a batched call's caches) it waits for ``end_batch``."""
        if self.batches:
            return
        blocks, self.pending = self.pending, []
        blocks = [b for b in blocks if self._writable(b)]
        if not blocks:
            return
        if self.paused_until and time.monotonic() < self.paused_until:
            self.add_stats(remote_skipped=len(blocks))  # the store would drop them: none encoded
            return
        size = self.value_size
        buffer = bytearray(len(blocks) * size)
        sources = []
        for i, block in enumerate(blocks):
            offset = i * size + self.header
            for g, page in enumerate(block.pages):
                if page is not None:
                    sources.append((page.level, page.pool_group, page.slot, offset))
                offset += self.page_sizes[g]
        if self.storage.transfer.export(sources, buffer):
            return  # a page read from disk failed its checksum: nothing written this call
        payload = memoryview(buffer)
        self.staged_values += [
            encode_value(
                self.fingerprint,
                block.key,
                block.parent.key,  # type: ignore[union-attr]
                (block.ordinal + 1) * self.tokens_per_block,
                self.tokens_per_block,
                [
                    None if p is None else bytes(payload[i * size + o : i * size + o + s])
                    for p, o, s in zip(block.pages, self._offsets(), self.page_sizes, strict=True)
                ],
                self.page_sizes,
            )
            for i, block in enumerate(blocks)
        ]
        self.staged_keys += [self.namespace + b.key for b in blocks]
        if len(self.staged_keys) >= HAND_BLOCKS or len(self.staged_keys) * size >= HAND_BYTES:
            self.hand()

    def hand(self) -> None:
        """Hand the store every staged block (one ``put``): at a cache's close, when a cache is
        created (before its match, which may read the store)."""
        if not self.staged_keys:
            return
        keys, values = self.staged_keys, self.staged_values
        self.staged_keys, self.staged_values = [], []
        try:
            pause = self.store.put(keys, values)
        except Exception:  # noqa: BLE001 - a write not made, never the commit's error
            self.add_stats(remote_errors=1)
            return
        self.add_stats(remote_written=len(keys))
        self.paused_until = 0.0
        seconds = pause_of(pause)
        if seconds > 0:
            self.paused_until = time.monotonic() + seconds

    def _offsets(self) -> list[int]:
        offsets, at = [], self.header
        for size in self.page_sizes:
            offsets.append(at)
            at += size
        return offsets

    def _writable(self, block: Block) -> bool:
        """Still in the tree, with every page a reader needs (``_complete``'s rule)."""
        if block.parent is None or block.parent.children.get(block.key) is not block:
            return False
        kinds = self.registry.kinds
        return all(p is not None or not kinds[g].drop_takes_subtree(block.ordinal) for g, p in enumerate(block.pages))


def pause_of(answer: object) -> float:
    """The seconds a ``put``'s answer asks the manager to hand the store nothing: a positive
    int or float (not a bool; an int too large for a float, or inf: for ever); 0 for anything
    else (None, NaN, a negative number, another type)."""
    if isinstance(answer, bool) or not isinstance(answer, int | float):
        return 0.0
    try:
        seconds = float(answer)
    except OverflowError:  # an int beyond a float's range
        return math.inf if answer > 0 else 0.0
    return seconds if seconds > 0 else 0.0
