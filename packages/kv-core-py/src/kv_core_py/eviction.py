"""Which evictable page goes first: lowest priority, then the one evictable the longest."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet

from kv_core_py.page import Page


class EvictionQueue:
    """One (level, pool group)'s evictable pages: a FIFO per priority, lowest priority first."""

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

    def candidates(self, exclude: AbstractSet[int], pending: Sequence[Page] = ()) -> Iterator[Page]:
        """Pages in eviction order, skipping ``exclude`` (ids), as if ``pending`` were pushed
        first (in order): each priority's queued pages, then its pending ones."""
        later: dict[int, list[Page]] = {}
        for page in pending:
            later.setdefault(page.priority, []).append(page)
        for priority in sorted(self._buckets.keys() | later.keys()):
            for page in self._buckets.get(priority, {}).values():
                if id(page) not in exclude:
                    yield page
            yield from later.get(priority, ())
