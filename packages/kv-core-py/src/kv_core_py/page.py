"""Pages: one slot of one layer group's pool group, holding one block's KV data.

A page is *uncommitted* (private to one cache) until its block enters the radix tree; then it
is *committed* and may be shared. Its status follows from who uses it: LOCKED while an active
cache reads it (device level only), HELD while only suspended (or commit-pending) caches keep
it, DROPPABLE when nobody does. It sits in one slot of one cache level and moves between levels
(``Storage.evictable`` says when it may be evicted).
"""

from __future__ import annotations


class Page:
    __slots__ = (
        "block",
        "holders",
        "layer_group",
        "level",
        "locks",
        "num_tokens",
        "planned_drops",
        "pool_group",
        "priority",
        "queued",
        "slot",
    )

    def __init__(self, slot: int, layer_group: int, pool_group: int, priority: int) -> None:
        self.slot = slot
        self.level = 0  # the cache level whose slot ``slot`` is
        self.layer_group = layer_group
        self.pool_group = pool_group
        self.priority = priority
        # The radix_tree.Block once committed. Typed ``object``, as C++ forward-declares it: the
        # tree imports this module, and only Storage.drop reads the block (it narrows the type).
        self.block: object = None
        self.num_tokens = 0  # tokens of the block this page is valid for (committed pages)
        self.holders = 0  # caches keeping the page (held or locked)
        self.locks = 0  # caches locking it (active)
        self.queued = False  # in its level's eviction queue
        self.planned_drops = 0  # planned-drop handles covering it, not dropped yet (planned_drop.py)

    @property
    def alive(self) -> bool:
        """False once dropped: a committed page leaves the tree, a held one never drops."""
        return self.block is not None or self.holders > 0

    @property
    def committed(self) -> bool:
        return self.block is not None
