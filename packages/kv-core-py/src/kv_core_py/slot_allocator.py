"""Slot ids of one pool group: recycled slots first (FIFO), then fresh ids 0, 1, 2, ..."""

from __future__ import annotations

from collections import deque
from itertools import islice

from kv_api.errors import OutOfPagesError


class SlotAllocator:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._recycled: deque[int] = deque()
        self._next_fresh = 0
        self._peak = 0  # the most slots in use at once since take_peak()

    @property
    def num_free(self) -> int:
        return len(self._recycled) + self.num_slots - self._next_fresh

    @property
    def next_fresh(self) -> int:
        """Every id handed out since the last shrink is below it."""
        return self._next_fresh

    def allocate(self, n: int) -> list[int]:
        """``n`` slot ids, all or none (``OutOfPagesError``)."""
        if n > self.num_free:
            raise OutOfPagesError(f"need {n} slots, {self.num_free} free")
        taken = [self._recycled.popleft() for _ in range(min(n, len(self._recycled)))]
        fresh = n - len(taken)
        taken.extend(range(self._next_fresh, self._next_fresh + fresh))
        self._next_fresh += fresh
        self._peak = max(self._peak, self.num_slots - self.num_free)
        return taken

    def take_peak(self) -> int:
        """The most slots in use at once since the last call; then counts from those in use now."""
        peak, self._peak = self._peak, self.num_slots - self.num_free
        return peak

    def peek(self, n: int, below: int | None = None) -> list[int]:
        """The ids ``allocate(n)`` would hand out now (after ``resize(below)``), without taking them."""
        limit = self.num_slots if below is None else below
        taken = list(islice((s for s in self._recycled if s < limit), n))
        fresh = min(self._next_fresh, limit)
        return taken + list(range(fresh, fresh + n - len(taken)))

    def resize(self, num_slots: int) -> None:
        """Hand out ids below ``num_slots`` from now on; every id at or above it must be free."""
        if num_slots < self.num_slots:
            self._recycled = deque(s for s in self._recycled if s < num_slots)
            self._next_fresh = min(self._next_fresh, num_slots)
        self.num_slots = num_slots

    def release(self, slot: int) -> None:
        self._recycled.append(slot)
