"""The in-memory index of a ``FileBlockStore`` directory: which blocks it holds, under which file
names, and in which order they are evicted.

A block's file is named ``<sha256(key) hex>.<sha256(parent key) hex or '-'>.<depth>.kv``: the name
alone rebuilds the index at open (one ``scandir`` and a ``stat`` per file, no file is read), and
the one rename that publishes the bytes publishes the metadata with them.

Eviction removes leaves only (blocks none of whose children are stored), least recently used
first, deepest first among equals, so what stays of a chain is always its prefix. A leaf's recency
passes to its parent when it goes, so a chain whose tail was used recently is worth its tail's use.
Blocks no chain's first block reaches (put after their prefix had gone: "unrooted") go before any
rooted block: only a manager holding their prefix itself can use them.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import os
from dataclasses import dataclass

__all__ = ["TEMP_PREFIX", "Entry", "FileIndex", "file_name", "key_id", "parse_name", "scan_directory"]

TEMP_PREFIX = ".tmp."  # a write in progress; a dot file, so no block's name can start with it
_SUFFIX = ".kv"
_ID_HEX = 64


def key_id(key: bytes) -> bytes:
    """SHA-256 of the whole key, namespace included: keys of different namespaces never share a file."""
    return hashlib.sha256(key).digest()


@dataclass(slots=True, eq=False)
class Entry:
    """A stored block; ``value`` is set while its write is pending (served from memory till then)."""

    id: bytes
    parent: bytes | None
    depth: int
    size: int
    tick: int
    value: bytes | None = None
    children: int = 0
    linked: bool = False  # its parent was in the index when it was added (counted in parent.children)
    rooted: bool = True  # a chain's first block (parent None) or a rooted block's child


def file_name(entry: Entry) -> str:
    parent = entry.parent.hex() if entry.parent is not None else "-"
    return f"{entry.id.hex()}.{parent}.{entry.depth}{_SUFFIX}"


def parse_name(name: str) -> tuple[bytes, bytes | None, int] | None:
    """(id, parent, depth) of a block file's name, or None where it is not one."""
    if not name.endswith(_SUFFIX):
        return None
    parts = name[: -len(_SUFFIX)].split(".")
    if len(parts) != 3 or len(parts[0]) != _ID_HEX or not parts[2].isdigit():
        return None
    try:
        ident = bytes.fromhex(parts[0])
        parent = None if parts[1] == "-" else bytes.fromhex(parts[1])
    except ValueError:
        return None
    if parent is not None and len(parent) != len(ident):
        return None
    return ident, parent, int(parts[2])


def scan_directory(path: str) -> tuple[list[Entry], list[str]]:
    """The blocks in ``path`` (recency: their mtime) and the names it should drop: leftover temp
    files of a crashed writer and second files of one block."""
    entries: dict[bytes, Entry] = {}
    stale: list[str] = []
    with os.scandir(path) as it:
        for item in it:
            if item.name.startswith(TEMP_PREFIX):
                stale.append(item.name)
                continue
            parsed = parse_name(item.name)
            if parsed is None:
                continue  # not ours (the lock file, an operator's note): neither counted nor touched
            ident, parent, depth = parsed
            if ident in entries:
                stale.append(item.name)
                continue
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since scandir listed it
            entries[ident] = Entry(ident, parent, depth, st.st_size, st.st_mtime_ns)
    return list(entries.values()), stale


class FileIndex:
    """Entries by id, their bytes on disk and pending, and a heap of eviction candidates (lazy:
    an item is checked when popped, stale ones are skipped). Not thread safe: the store locks."""

    def __init__(self) -> None:
        self.entries: dict[bytes, Entry] = {}
        self.disk_bytes = 0
        self.pending_bytes = 0
        self._heap: list[tuple[bool, int, int, int, bytes]] = []
        self._seq = itertools.count()

    def load(self, entries: list[Entry]) -> None:
        """Entries found on disk at open, linked to their parents."""
        for entry in entries:
            self.entries[entry.id] = entry
            self.disk_bytes += entry.size
        for entry in entries:
            parent = self.entries.get(entry.parent) if entry.parent is not None else None
            if parent is not None:
                parent.children += 1
                entry.linked = True
        self._find_roots(entries)
        self._rebuild_heap()

    def _find_roots(self, entries: list[Entry]) -> None:
        """Set ``rooted`` walking up each chain once (iteratively: chains run thousands deep)."""
        done: set[bytes] = set()
        for entry in entries:
            path: list[Entry] = []
            node: Entry | None = entry
            while node is not None and node.id not in done:
                done.add(node.id)  # also ends a cycle of hand-made names
                path.append(node)
                node = self.entries.get(node.parent) if node.parent is not None else None
            rooted = node.rooted if node is not None else path[-1].parent is None
            for item in reversed(path):
                item.rooted = rooted = rooted and (item.parent is None or item.linked)

    def add(self, entry: Entry) -> None:
        self.entries[entry.id] = entry
        parent = self.entries.get(entry.parent) if entry.parent is not None else None
        if parent is not None:
            parent.children += 1
            entry.linked = True
        entry.rooted = entry.parent is None or (parent is not None and parent.rooted)
        if entry.value is not None:
            self.pending_bytes += entry.size
        else:
            self.disk_bytes += entry.size
            self._push_if_leaf(entry)

    def written(self, entry: Entry) -> None:
        """Its file is in place: its bytes move from pending to disk and it may be evicted."""
        entry.value = None
        self.pending_bytes -= entry.size
        self.disk_bytes += entry.size
        self._push_if_leaf(entry)

    def orphaned(self, entry: Entry) -> bool:
        """Its parent was stored when it was added and is gone: writing it would store a block no
        chain reaches."""
        return entry.linked and entry.parent not in self.entries

    def remove(self, ident: bytes) -> Entry | None:
        entry = self.entries.pop(ident, None)
        if entry is None:
            return None
        if entry.value is not None:
            self.pending_bytes -= entry.size
        else:
            self.disk_bytes -= entry.size
        parent = self.entries.get(entry.parent) if entry.linked and entry.parent is not None else None
        if parent is not None:
            parent.children = max(0, parent.children - 1)  # 0: a parent removed and stored again since
            parent.tick = max(parent.tick, entry.tick)  # the chain's recency stays with what is left of it
            self._push_if_leaf(parent)
        return entry

    def touch(self, entry: Entry, tick: int) -> None:
        if tick > entry.tick:
            entry.tick = tick
            self._push_if_leaf(entry)

    def victim(self) -> Entry | None:
        """The next block to evict (left in the index: the caller deletes its file, then removes it)."""
        while self._heap:
            _, tick, _, _, ident = self._heap[0]
            entry = self.entries.get(ident)
            if entry is not None and entry.value is None and entry.children == 0 and entry.tick == tick:
                return entry
            heapq.heappop(self._heap)
        return None

    def _push_if_leaf(self, entry: Entry) -> None:
        if entry.value is None and entry.children == 0:
            heapq.heappush(self._heap, (entry.rooted, entry.tick, -entry.depth, next(self._seq), entry.id))
            if len(self._heap) > 2 * len(self.entries) + 1024:
                self._rebuild_heap()  # touches leave stale items behind: keep the heap O(entries)

    def _rebuild_heap(self) -> None:
        self._heap = [
            (e.rooted, e.tick, -e.depth, next(self._seq), e.id)
            for e in self.entries.values()
            if e.value is None and e.children == 0
        ]
        heapq.heapify(self._heap)
