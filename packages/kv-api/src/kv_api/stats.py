"""Statistics a manager reports."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StorageStatistics"]


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
