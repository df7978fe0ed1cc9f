"""Enums and constants of the reference API."""

from __future__ import annotations

import enum

__all__ = [
    "BAD_PAGE_INDEX",
    "DEFAULT_KEY_FORMAT",
    "DEFAULT_PRIORITY",
    "GPU_LEVEL",
    "KEY_FORMATS",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "SHA256_U32",
    "SHA256_U64",
    "CacheTier",
    "KVCacheStatus",
    "PageIndexMode",
    "PageStatus",
]

#: Page index reported for a block that has no page (stale, evicted or not allocated).
BAD_PAGE_INDEX = -1
#: Cache level of the device tier; ``cache_tiers[0]`` is always the device tier.
GPU_LEVEL = 0
#: Eviction priorities a priority callback may give; pages get ``DEFAULT_PRIORITY`` without one.
MIN_PRIORITY = 0
DEFAULT_PRIORITY = 35
MAX_PRIORITY = 100
#: Block-key formats (docs/key-format.md).
SHA256_U32 = "sha256-u32"
SHA256_U64 = "sha256-u64"
KEY_FORMATS = (SHA256_U32, SHA256_U64)
DEFAULT_KEY_FORMAT = SHA256_U32


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers (``b > 0``): the rounding of every block count the contract defines."""
    return -(-a // b)


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
