"""KV-cache events, as a KV-aware router consumes them.

``hash_algo`` decides how block keys appear in events: ``v2_sha256`` (lowercase hex),
``v2_sha256_64`` (first 8 digest bytes, big-endian) or ``v1_block_key`` (legacy 64-bit mix).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

__all__ = [
    "HASH_ALGOS",
    "BlockHash",
    "Created",
    "Diff",
    "KVCacheEvent",
    "MmKey",
    "Removed",
    "Stored",
    "StoredBlock",
    "UniqueToken",
    "Updated",
]

HASH_ALGOS = ("v2_sha256", "v2_sha256_64", "v1_block_key")

BlockHash: TypeAlias = str | int


@dataclass(frozen=True)
class UniqueToken:
    token_id: int | str  # a digest token serialises as its lowercase hex
    token_extra_id: int = 0


@dataclass(frozen=True)
class MmKey:
    digest: str
    start_offset: int
    uuid: str | None = None


@dataclass(frozen=True)
class StoredBlock:
    block_hash: BlockHash
    tokens: tuple[UniqueToken, ...]
    cache_level: int
    priority: int
    mm_keys: tuple[MmKey, ...] = ()
    cache_salt: int | None = None
    lora_id: int | None = None  # the reuse scope's LoRA adapter (routers scope blocks by it)


@dataclass(frozen=True)
class Created:
    num_blocks_per_cache_level: tuple[int, ...]


@dataclass(frozen=True)
class Stored:
    parent_hash: BlockHash | None
    blocks: tuple[StoredBlock, ...]


@dataclass(frozen=True)
class Removed:
    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True)
class Diff:
    old: int
    new: int


@dataclass(frozen=True)
class Updated:
    block_hash: BlockHash
    cache_level: Diff | None = None
    priority: Diff | None = None


EventData: TypeAlias = Created | Stored | Removed | Updated


@dataclass(frozen=True)
class KVCacheEvent:
    event_id: int
    data: EventData
    window_size: int | None = None
    hash_algo: str = "v2_sha256"
    attention_dp_rank: int | None = None
    layer_group_id: int | None = None
    extra: dict[str, object] = field(default_factory=dict, compare=False)
