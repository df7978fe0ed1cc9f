"""Enums and constants of the reference API."""

from __future__ import annotations

import enum

__all__ = [
    "BAD_PAGE_INDEX",
    "BUFFER_SIZE_LIMIT",
    "CACHE_ID_LIMIT",
    "DEFAULT_KEY_FORMAT",
    "DEFAULT_PRIORITY",
    "EVENT_ENTRIES_LIMIT",
    "GHOST_RECORD_LIMIT",
    "GPU_LEVEL",
    "KEY_FORMATS",
    "LAYER_ID_LIMIT",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "SHA256_U32",
    "SHA256_U64",
    "TOKENS_PER_BLOCK_LIMIT",
    "TOKEN_LIMIT",
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

# Exclusive upper bounds of the contract's ints (docs/errors.md, "Ranges"). Each is far above what
# a deployment needs and low enough that every product a backend forms from them (block ordinal
# times tokens_per_block, a buffer's size times its expansion) stays below 2**63 in int64.
#: Token counts: capacities, history lengths, windows, sinks, backoff, system prompts.
TOKEN_LIMIT = 1 << 40
#: ``tokens_per_block`` and ``tokens_per_block_override``.
TOKENS_PER_BLOCK_LIMIT = 1 << 20
#: Bytes of one buffer per block (``BufferConfig.size``).
BUFFER_SIZE_LIMIT = 1 << 40
#: Layer ids in a config (any int may be looked up: an unknown one is a ``KeyError``).
LAYER_ID_LIMIT = 1 << 31
#: Ids given to ``create_kv_cache``; automatic ids count on above the largest id given, so they
#: stay below 2**63 for any number of caches a process can create.
CACHE_ID_LIMIT = 1 << 62
#: ``max_kv_event_entries`` lies in ``[-EVENT_ENTRIES_LIMIT, EVENT_ENTRIES_LIMIT)`` (<= 0 publishes nothing).
EVENT_ENTRIES_LIMIT = 1 << 31
#: ``ghost_record_blocks`` lies in ``[0, GHOST_RECORD_LIMIT)``: keys a manager remembers.
GHOST_RECORD_LIMIT = 1 << 31


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers (``b > 0``): the rounding of every block count the contract defines."""
    return -(-a // b)


class CacheTier(enum.IntEnum):
    GPU_MEM = 0
    HOST_MEM = 1
    DISK = 2
    REMOTE = 3

    @property
    def level_name(self) -> str:
        """``device``, ``host``, ``disk`` or ``remote``: how reports and metrics name the level."""
        return ("device", "host", "disk", "remote")[self]


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
