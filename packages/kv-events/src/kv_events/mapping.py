"""kvcore's events (``kv_api.events``) as wire events (``kv_events.wire``), what a router sees.

A router counts whole blocks of one prefix chain, so only these are published:

- blocks of the full-attention layer group (``window_size`` None): a sliding-window group
  announces the same blocks again with a shorter, window-bound life, which a router keyed by
  prefix cannot use; a model without full-attention layers publishes no blocks;
- full blocks (``block_size`` tokens): a partial last block is never published, nor its removal;
- blocks whose tokens are all plain ids (a multimodal digest token has no token id a router's
  query could carry) and whose parent was published, so every chain on the wire is rooted.

``Created`` (a new manager holds nothing) becomes ``AllBlocksCleared``, so a router drops what it
believed about an instance that restarted on the same endpoint; ``Removed`` becomes
``BlockRemoved`` on the medium each block was on; a tier move (``Updated`` with a cache-level
``Diff``) becomes the removal from the old medium and the storage on the new one. Priority
changes are not on the wire.

Hashes are the 64-bit ``v2_sha256_64`` form, the first 8 digest bytes big-endian: taken as is
from an event manager built with ``hash_algo="v2_sha256_64"``, converted exactly from the hex of
``v2_sha256``; ``v1_block_key`` (and ``auto``, which reads it) is refused, since it is a
different hash whose fallback mixes in the v2 form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kv_api import DiskCacheTierConfig, HostCacheTierConfig, KVCacheManagerConfig
from kv_api.events import BlockHash, Created, KVCacheEvent, Removed, Stored, Updated
from kv_events.wire import MEDIUM_CPU, MEDIUM_DISK, MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, WireEvent

__all__ = ["WIRE_HASH_ALGOS", "WireMapper", "check_hash_algo", "media", "wire_hash"]

#: The event managers' ``hash_algo`` values whose hashes map to the wire's 64-bit form.
WIRE_HASH_ALGOS = ("v2_sha256_64", "v2_sha256")


def check_hash_algo(hash_algo: str) -> None:
    if hash_algo not in WIRE_HASH_ALGOS:
        raise ValueError(
            f"hash_algo {hash_algo!r}: the wire carries v2_sha256_64 hashes; build the event manager "
            f"with hash_algo='v2_sha256_64' (or 'v2_sha256')"
        )


def wire_hash(block_hash: BlockHash, hash_algo: str) -> int:
    """The 64-bit wire hash of an event's block hash."""
    if hash_algo == "v2_sha256_64" and isinstance(block_hash, int):
        return block_hash
    if hash_algo == "v2_sha256" and isinstance(block_hash, str):
        return int(block_hash[:16], 16)  # the first 8 bytes of the digest, big-endian
    raise ValueError(f"block hash {block_hash!r} is not a {hash_algo} hash")


def media(config: KVCacheManagerConfig) -> list[str]:
    """The wire's ``medium`` of each cache level of ``config``, warm to cold."""
    out = []
    for tier in config.cache_tiers:
        if isinstance(tier, HostCacheTierConfig):
            out.append(MEDIUM_CPU)
        elif isinstance(tier, DiskCacheTierConfig):
            out.append(MEDIUM_DISK)
        else:
            out.append(MEDIUM_GPU)
    return out


@dataclass(frozen=True)
class _Published:
    parent: int | None
    token_ids: tuple[int, ...]
    level: int
    lora_id: int | None


class WireMapper:
    """Maps one event manager's events, in order; it remembers the published blocks (their parent,
    tokens and level), which removals and tier moves need."""

    def __init__(self, block_size: int, media: Sequence[str] = (MEDIUM_GPU,)) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 (got {block_size})")
        self.block_size = block_size
        self.media = list(media)
        self._published: dict[int, _Published] = {}

    @classmethod
    def for_config(cls, config: KVCacheManagerConfig) -> WireMapper:
        return cls(config.tokens_per_block, media(config))

    @property
    def published_blocks(self) -> int:
        """Blocks a router holds now, by what was published."""
        return len(self._published)

    def _medium(self, level: int) -> str | None:
        return self.media[level] if 0 <= level < len(self.media) else None

    def map(self, event: KVCacheEvent) -> list[WireEvent]:
        data = event.data
        if isinstance(data, Created):
            self._published.clear()
            return [AllBlocksCleared()]
        if event.window_size is not None:
            return []
        check_hash_algo(event.hash_algo)
        if isinstance(data, Stored):
            return self._stored(data, event.hash_algo)
        if isinstance(data, Removed):
            return self._removed([wire_hash(h, event.hash_algo) for h in data.block_hashes])
        if isinstance(data, Updated) and data.cache_level is not None:
            return self._moved(wire_hash(data.block_hash, event.hash_algo), data.cache_level.old, data.cache_level.new)
        return []

    def _stored(self, data: Stored, hash_algo: str) -> list[WireEvent]:
        parent = None if data.parent_hash is None else wire_hash(data.parent_hash, hash_algo)
        out: list[WireEvent] = []
        for block in data.blocks:
            tokens = tuple(t.token_id for t in block.tokens)
            if parent is not None and parent not in self._published:
                break  # an unpublished parent: nothing below it is published either
            if len(tokens) != self.block_size or not all(isinstance(t, int) for t in tokens):
                break  # partial (always the last) or with digest tokens
            block_hash = wire_hash(block.block_hash, hash_algo)
            ids = tuple(int(t) for t in tokens)
            self._published[block_hash] = _Published(parent, ids, block.cache_level, block.lora_id)
            medium = self._medium(block.cache_level)
            last = out[-1] if out else None
            # One BlockStored per run of blocks on the same medium, each continuing the chain (one
            # chain has one scope, so one LoRA id).
            if isinstance(last, BlockStored) and last.medium == medium and last.block_hashes[-1] == parent:
                last.block_hashes.append(block_hash)
                last.token_ids.extend(ids)
            else:
                out.append(BlockStored([block_hash], parent, list(ids), self.block_size, block.lora_id, medium))
            parent = block_hash
        return out

    def _removed(self, hashes: list[int]) -> list[WireEvent]:
        by_medium: dict[str | None, list[int]] = {}
        for h in hashes:
            block = self._published.pop(h, None)
            if block is not None:
                by_medium.setdefault(self._medium(block.level), []).append(h)
        return [BlockRemoved(hs, medium) for medium, hs in by_medium.items()]

    def _moved(self, block_hash: int, old: int, new: int) -> list[WireEvent]:
        block = self._published.get(block_hash)
        if block is None or old == new:
            return []
        self._published[block_hash] = _Published(block.parent, block.token_ids, new, block.lora_id)
        return [
            BlockRemoved([block_hash], self._medium(block.level)),
            BlockStored(
                [block_hash], block.parent, list(block.token_ids), self.block_size, block.lora_id, self._medium(new)
            ),
        ]
