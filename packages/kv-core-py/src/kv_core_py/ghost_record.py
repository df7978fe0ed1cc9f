"""The ghost record (docs/manager.md, "Why a prompt missed"): the keys of the last full blocks
that left the tree, each with the cache level it was dropped from and when, so that a prompt's
missed block can be told apart as evicted rather than never seen."""

from __future__ import annotations


class GhostRecord:
    """At most ``capacity`` keys, oldest forgotten first. Time is counted in caches created
    (``tick``): an entry's age is how many were created since it was recorded."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.clock = 0  # caches created so far
        self._entries: dict[bytes, tuple[int, int]] = {}  # key -> (level, clock), oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def tick(self) -> None:
        self.clock += 1

    def record(self, key: bytes, level: int) -> None:
        """A full block left the tree, dropped from ``level``."""
        if self.capacity == 0:
            return
        self._entries.pop(key, None)  # recorded again: it is the newest now
        if len(self._entries) == self.capacity:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (level, self.clock)

    def forget(self, key: bytes) -> None:
        """The block is back in the tree."""
        self._entries.pop(key, None)

    def find(self, key: bytes) -> tuple[int, int] | None:
        """``(level, age)`` of a recorded key, None if not recorded."""
        entry = self._entries.get(key)
        return None if entry is None else (entry[0], self.clock - entry[1])
