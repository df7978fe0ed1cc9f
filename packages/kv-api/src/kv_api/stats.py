"""Statistics a manager reports."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheStats", "StorageStatistics"]


@dataclass(frozen=True)
class StorageStatistics:
    """Slot accounting of one pool group at one cache level, in slots.

    ``available = free + evictable`` and ``unavailable = total - available``.
    """

    total: int
    free: int
    evictable: int

    @property
    def available(self) -> int:
        return self.free + self.evictable

    @property
    def unavailable(self) -> int:
        return self.total - self.available


@dataclass(frozen=True)
class CacheStats:
    """Counters of a manager, since construction (committed) or since the last reset (iteration).

    - ``requests``: caches created; ``lookup_tokens``: tokens they asked to reuse;
      ``reused_tokens``: tokens reused from the tree.
    - ``allocated_pages``: pages handed out; ``evicted_pages``: pages evicted from the device
      level to make room (moved to a colder level or dropped); ``onboarded_pages``: pages moved
      up to the device level (``resume``, ``prefetch``).
    - ``committed_blocks``: blocks that entered the tree.
    """

    requests: int = 0
    lookup_tokens: int = 0
    reused_tokens: int = 0
    allocated_pages: int = 0
    evicted_pages: int = 0
    committed_blocks: int = 0
    onboarded_pages: int = 0
