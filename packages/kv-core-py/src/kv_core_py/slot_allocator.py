"""Slot ids of one pool group: recycled slots first (FIFO), then fresh ids 0, 1, 2, ..."""

from __future__ import annotations

from collections import deque

from kv_api.errors import OutOfPagesError


class SlotAllocator:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._recycled: deque[int] = deque()
        self._next_fresh = 0

    @property
    def num_free(self) -> int:
        return len(self._recycled) + self.num_slots - self._next_fresh

    def allocate(self, n: int) -> list[int]:
        """``n`` slot ids, all or none (``OutOfPagesError``)."""
        if n > self.num_free:
            raise OutOfPagesError(f"need {n} slots, {self.num_free} free")
        taken = [self._recycled.popleft() for _ in range(min(n, len(self._recycled)))]
        fresh = n - len(taken)
        taken.extend(range(self._next_fresh, self._next_fresh + fresh))
        self._next_fresh += fresh
        return taken

    def release(self, slot: int) -> None:
        self._recycled.append(slot)
