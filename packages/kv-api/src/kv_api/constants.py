"""Enums and constants of the reference API."""

from __future__ import annotations

import enum

__all__ = [
    "BAD_PAGE_INDEX",
    "DEFAULT_PRIORITY",
    "GPU_LEVEL",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "CacheTier",
    "KVCacheStatus",
    "PageIndexMode",
    "PageStatus",
]

#: Page index reported for a block that has no page (stale, evicted or not allocated).
BAD_PAGE_INDEX = -1
#: Cache level of the device tier; ``cache_tiers[0]`` is always the device tier.
GPU_LEVEL = 0
MIN_PRIORITY = 0
DEFAULT_PRIORITY = 35
MAX_PRIORITY = 100


class CacheTier(enum.IntEnum):
    GPU_MEM = 0
    HOST_MEM = 1
    DISK = 2


class PageStatus(enum.IntEnum):
    LOCKED = 0
    HELD = 1
    DROPPABLE = 2


class PageIndexMode(enum.IntEnum):
    """How page indices address a pool: one index space per layer, or shared by the pool."""

    PER_LAYER = 0
    SHARED = 1


class KVCacheStatus(enum.IntEnum):
    ACTIVE = 0
    SUSPENDED = 1
    CLOSED = 2
