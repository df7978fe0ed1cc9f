"""Which committed droppable page goes first: lowest priority, least recently released."""

from __future__ import annotations

from kv_core_py.page import Page


class EvictionQueue:
    """One pool group's evictable pages: a FIFO per priority, lowest priority popped first."""

    def __init__(self) -> None:
        self._buckets: dict[int, dict[int, Page]] = {}  # priority -> insertion-ordered pages
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, page: Page) -> None:
        self._buckets.setdefault(page.priority, {})[id(page)] = page
        self._size += 1

    def remove(self, page: Page) -> None:
        bucket = self._buckets[page.priority]
        del bucket[id(page)]
        if not bucket:
            del self._buckets[page.priority]
        self._size -= 1

    def pop(self) -> Page:
        priority = min(self._buckets)
        bucket = self._buckets[priority]
        page = bucket.pop(next(iter(bucket)))
        if not bucket:
            del self._buckets[priority]
        self._size -= 1
        return page
