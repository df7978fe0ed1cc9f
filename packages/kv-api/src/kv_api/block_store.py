"""A store of block values shared beyond one manager (docs/store.md): the interface both
backends call for a remote tier, and an in-memory store for tests and single processes."""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence

__all__ = ["BlockStore", "MemoryBlockStore"]


class BlockStore(abc.ABC):
    """Values under byte keys, read and written in batches of a prefix chain's consecutive
    blocks (first block first). A store is a cache: a method never raises for the store's own
    faults (a dead server, a full disk); it answers with fewer blocks and counts the fault.

    The manager calls it with its lock held: every method returns promptly (bounded timeouts)."""

    @abc.abstractmethod
    def contains(self, keys: Sequence[bytes]) -> int:
        """How many of ``keys`` the store has, counted from the first up to the first it lacks.
        A manager passes a ``StoreKeys`` here and to ``get_into`` (each key built where read)."""

    @abc.abstractmethod
    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        """Copy the value of ``keys[i]`` into ``buffers[i]`` for each ``i < n``; returns ``n``,
        stopping at the first key missing or whose value is not exactly ``len(buffers[i])``
        bytes long (a bad value: counted). Buffers past ``n`` may have been written."""

    @abc.abstractmethod
    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> float | None:
        """Store ``values[i]`` under ``keys[i]``, ``values`` owned by the store from now on;
        returns without waiting on the network or the disk. A key already stored keeps its
        value (a fleet writes a block once). What cannot be written in bounded memory is dropped
        and counted. Returns None, or (a store that drops every put for now: down, closed) the
        seconds to hand it nothing (``math.inf``: for ever); the manager then neither encodes
        nor hands over its committed blocks for that long (``CacheStats.remote_skipped``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finish or drop what is pending (bounded), release connections and files; idempotent."""


class MemoryBlockStore(BlockStore):
    """A dict in this process: synchronous, unbounded, for tests and a single process. Threads may
    share it."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.num_bad_values = 0
        self._lock = threading.Lock()

    def contains(self, keys: Sequence[bytes]) -> int:
        with self._lock:
            for n, key in enumerate(keys):
                if key not in self.values:
                    return n
            return len(keys)

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        with self._lock:
            for n, (key, buffer) in enumerate(zip(keys, buffers, strict=True)):
                value = self.values.get(key)
                if value is None:
                    return n
                if len(value) != len(buffer):
                    self.num_bad_values += 1
                    return n
                buffer[:] = value
            return len(keys)

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> float | None:
        with self._lock:
            for key, value in zip(keys, values, strict=True):
                self.values.setdefault(bytes(key), bytes(value))
        return None

    def close(self) -> None:
        pass
