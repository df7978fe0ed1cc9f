"""Pages: one slot of one life cycle's pool group, holding one block's KV data.

A page is *uncommitted* (private to one cache) until its block enters the radix tree; then it
is *committed* and may be shared. Its status follows from who uses it: LOCKED while an active
cache reads it, HELD while only suspended (or commit-pending) caches keep it, DROPPABLE when
nobody does. Committed droppable pages are evictable; uncommitted ones are freed at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kv_api.constants import GPU_LEVEL, PageStatus

if TYPE_CHECKING:
    from kv_core_py.radix_tree import Block


class Page:
    __slots__ = ("block", "holders", "level", "life_cycle", "locks", "num_tokens", "pool_group", "priority", "slot")

    def __init__(self, slot: int, life_cycle: int, pool_group: int, priority: int) -> None:
        self.slot = slot
        self.life_cycle = life_cycle
        self.pool_group = pool_group
        self.priority = priority
        self.level = GPU_LEVEL
        self.block: Block | None = None  # set once committed
        self.num_tokens = 0  # tokens of the block this page is valid for (committed pages)
        self.holders = 0  # caches keeping the page (held or locked)
        self.locks = 0  # caches locking it (active)

    @property
    def committed(self) -> bool:
        return self.block is not None

    @property
    def status(self) -> PageStatus:
        if self.locks:
            return PageStatus.LOCKED
        return PageStatus.HELD if self.holders else PageStatus.DROPPABLE
