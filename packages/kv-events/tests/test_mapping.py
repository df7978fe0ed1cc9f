"""The mapping from kvcore's events to wire events (kv_events.mapping), on hand-made events, and
the wire's encoding (array-like, tag first)."""

from __future__ import annotations

import msgspec
import pytest

from kv_api.events import Created, Diff, KVCacheEvent, Removed, Stored, StoredBlock, UniqueToken, Updated
from kv_events.mapping import WireMapper, wire_hash
from kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, decode_batch, encode_batch

BS = 2
ALGO = "v2_sha256_64"


def block(h: int, tokens: list[int | str], level: int = 0) -> StoredBlock:
    return StoredBlock(h, tuple(UniqueToken(t) for t in tokens), level, 35)


def stored(parent: int | None, *blocks: StoredBlock, window: int | None = None) -> KVCacheEvent:
    return KVCacheEvent(1, Stored(parent, blocks), window, ALGO, None, 0 if window is None else 1)


def event(data: Removed | Updated | Created, window: int | None = None) -> KVCacheEvent:
    return KVCacheEvent(2, data, window, ALGO, None, None if isinstance(data, Created) else 0)


def test_stored_full_blocks_only_one_event_per_medium_run() -> None:
    m = WireMapper(BS, ["GPU", "CPU"])
    got = m.map(stored(None, block(1, [1, 2]), block(2, [3, 4]), block(3, [5, 6], 1), block(4, [7])))
    assert got == [
        BlockStored([1, 2], None, [1, 2, 3, 4], BS, None, "GPU"),
        BlockStored([3], 2, [5, 6], BS, None, "CPU"),
    ]
    assert m.published_blocks == 3
    assert m.map(event(Removed((4, 3, 99)))) == [BlockRemoved([3], "CPU")]  # partial and unknown: not published


def test_window_groups_are_skipped_and_created_clears() -> None:
    m = WireMapper(BS)
    assert m.map(stored(None, block(1, [1, 2]), window=8)) == []
    assert m.map(stored(None, block(1, [1, 2]))) != []
    assert m.map(event(Removed((1,)), window=8)) == []
    assert m.map(event(Created((16,)))) == [AllBlocksCleared()]
    assert m.published_blocks == 0


def test_tier_move_is_removal_then_storage() -> None:
    m = WireMapper(BS, ["GPU", "CPU", "DISK"])
    m.map(stored(None, block(1, [1, 2])))
    m.map(stored(1, block(2, [3, 4])))
    assert m.map(event(Updated(2, Diff(0, 2)))) == [
        BlockRemoved([2], "GPU"),
        BlockStored([2], 1, [3, 4], BS, None, "DISK"),
    ]
    assert m.map(event(Updated(2, None, Diff(1, 2)))) == []  # a priority change is not on the wire
    assert m.map(event(Removed((2,)))) == [BlockRemoved([2], "DISK")]


def test_digest_tokens_and_orphans_stop_the_chain() -> None:
    m = WireMapper(BS)
    assert m.map(stored(None, block(1, [1, "ab" * 32]), block(2, [3, 4]))) == []
    assert m.map(stored(7, block(8, [1, 2]))) == []  # parent 7 was never published


def test_hash_forms() -> None:
    digest = "0123456789abcdef" + "ff" * 24
    assert wire_hash(digest, "v2_sha256") == 0x0123456789ABCDEF
    assert wire_hash(5, "v2_sha256_64") == 5
    with pytest.raises(ValueError, match="v1_block_key"):
        WireMapper(BS).map(KVCacheEvent(1, Removed((5,)), None, "v1_block_key", None, 0))


def test_encoding_is_array_like_and_tagged() -> None:
    batch = EventBatch(1.5, [BlockStored([2**64 - 1], None, [1, 2], BS, None, "GPU"), BlockRemoved([3], "GPU")], 0)
    raw = msgspec.msgpack.decode(encode_batch(batch))
    assert raw == [
        1.5,
        [["BlockStored", [2**64 - 1], None, [1, 2], BS, None, "GPU", None], ["BlockRemoved", [3], "GPU"]],
        0,
    ]
    assert decode_batch(encode_batch(batch)) == batch
    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x01")
