"""The wire format KV-aware routers read: vLLM's ``EventBatch`` of tagged events, msgpack-encoded.

Every struct is array-like (a msgpack array in field order, the event's class name first) and
omits trailing defaults, as vLLM's publishers and its subscriber example encode them; Dynamo's
indexer decodes that form (and the map form newer vLLM writes). The optional trailing fields of
newer vLLM versions (``extra_keys``, ``group_idx``, the cache-spec fields) are left out: kvcore
publishes only full-attention blocks (docs/events.md), which is what a consumer assumes when
they are absent.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_DISK",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "WireEvent",
    "decode_batch",
    "encode_batch",
]

#: ``medium`` names per cache level (0 device, 1 host, 2 disk): vLLM's "GPU", and the names its
#: CPU-offloading connector and Dynamo's indexer use for the host and disk tiers.
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_DISK = "DISK"


class BlockStored(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True, frozen=True):
    """Full blocks that became reusable, a chain in order: ``block_hashes[0]``'s parent is
    ``parent_block_hash`` (None at the root) and ``token_ids`` are the blocks' tokens, concatenated."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True, frozen=True):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True, frozen=True):
    pass


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    ts: float  # seconds since the epoch, when the batch was published
    events: list[WireEvent]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EventBatch)


def encode_batch(batch: EventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> EventBatch:
    """The batch in ``payload``; ``msgspec.DecodeError`` (a ``ValueError``) if it is not one."""
    return _decoder.decode(payload)
