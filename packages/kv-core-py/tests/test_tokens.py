"""``Tokens`` reads the same whichever path took the input: packed plain ints, or the general
path's list (digest tokens, int-likes, other iterables)."""

from __future__ import annotations

import importlib
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_api.constants import KEY_FORMATS
from kv_api.keys import encode_block
from kv_api.keys import sequence_to_blockchain_keys as reference_pairs
from kv_core_py.block_keys import chained_keys, root_key, sequence_to_blockchain_keys
from kv_core_py.tokens import MARSHAL_FROM, Tokens, int_segments, pack_ints

tokens_module = importlib.import_module("kv_core_py.tokens")

DIGEST = bytes(range(32))
IDS = list(range(100, 110))


@pytest.mark.parametrize("key_format", KEY_FORMATS)
def test_packed_and_listed_tokens_read_alike(key_format: str) -> None:
    packed = Tokens(array("i", IDS), key_format)
    listed = Tokens(iter(IDS), key_format)  # an iterator is never packed
    assert packed.packed is not None and listed.packed is None
    for tokens in (packed, listed):
        assert len(tokens) == len(IDS)
        assert tokens.to_list() == IDS
        assert tokens.to_list(3, 7) == IDS[3:7]
        assert tokens.to_list(8, 20) == IDS[8:]
        assert tokens.payload(2, 5) == encode_block(list(IDS[2:5]), key_format)


def test_digest_tokens_take_the_list_path() -> None:
    tokens = Tokens([1, DIGEST, 2], KEY_FORMATS[0])
    assert tokens.packed is None
    assert tokens.to_list(1) == [DIGEST, 2]
    assert tokens.payload(0, 2) == encode_block([1, DIGEST], KEY_FORMATS[0])


def test_chained_keys_continue_a_chain() -> None:
    """Keys of blocks [first, first + count) chained from block first - 1's key are the same
    keys a chain from the root gives, and a chain stops where the tokens end."""
    tokens = Tokens(list(range(11)), KEY_FORMATS[0])
    whole = chained_keys(root_key(None), tokens, 0, 10, 4)
    assert len(whole) == 1 + 3  # the root, two full blocks, the partial tail
    assert chained_keys(whole[1], tokens, 1, 2, 4) == whole[1:]


class _IntSubclass(int):
    pass


# Items pack_ints must refuse (the general path decides them): every one a different marshal type
# byte, or an int whose record is not b"i" + 4 bytes, or one with bit 31 set.
_REFUSED: list[object] = [True, False, _IntSubclass(5), -1, 2**31, 2**32, 2**63, 1.0, None, DIGEST, "a", [1], (1,)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 2**31 - 1), max_size=300),
    st.lists(st.tuples(st.integers(0, 2 * MARSHAL_FROM), st.sampled_from(_REFUSED)), max_size=3),
    st.booleans(),
)
def test_pack_ints_takes_exactly_the_plain_u32_ids(ids: list[int], odd: list[tuple[int, object]], long: bool) -> None:
    """Both routes: type() and array('I') for short lists, marshal from MARSHAL_FROM items."""
    items: list[object] = [*range(2**31 - MARSHAL_FROM, 2**31), *ids] if long else [*ids]
    for position, item in odd:
        items.insert(min(position, len(items)), item)
    plain = [t for t in items if type(t) is int and 0 <= t < 2**31]
    packed = pack_ints(items, "sha256-u32")
    assert packed == (array("I", plain).tobytes() if len(plain) == len(items) else None)


@pytest.mark.parametrize("key_format", KEY_FORMATS)
def test_int_segments_cut_a_list_in_order(key_format: str) -> None:
    ids = list(range(2**30 - 10_000, 2**30 + 10_000))
    for source in (ids, tuple(ids)):
        segments = int_segments(source, key_format, 7000)
        assert segments is not None and [len(s) for s in segments] == [7000, 7000, 6000]
        assert [t for s in segments for t in s.to_list()] == ids
        assert b"".join(s.packed or b"" for s in segments) == Tokens(ids, key_format).packed
        assert all(type(s.as_list()) is list for s in segments)
    assert int_segments([*ids[:50], True, *ids[:50]], key_format, 40) is None


def test_a_list_changed_between_segments_is_not_read_in_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread may shrink the list between two segments: a short segment that is not the
    last makes the key functions read the list again in one go, so blocks stay whole."""
    ids = list(range(20_000))

    def pack_then_shrink(items: list[object], key_format: str) -> bytes | None:
        out = pack_ints(items, key_format)
        del ids[10_000:]  # after the first segment, as another thread could
        return out

    monkeypatch.setattr(tokens_module, "pack_ints", pack_then_shrink)
    assert int_segments(ids, KEY_FORMATS[0], 8192) is None
    ids[:] = range(20_000)
    pairs = list(sequence_to_blockchain_keys(32, None, ids))
    monkeypatch.undo()
    assert pairs == list(reference_pairs(32, None, list(range(10_000))))
    assert all(len(block) == 32 for block, _ in pairs[1:-1]) and len(pairs[-1][0]) == 10_000 % 32


def test_segments_read_alike() -> None:
    tokens = Tokens([1, DIGEST, 2, 3], KEY_FORMATS[0])
    part = tokens.segment(1, 3)
    assert part.to_list() == [DIGEST, 2] and part.payload(0, 2) == tokens.payload(1, 3)
    packed = Tokens(array("i", IDS), KEY_FORMATS[1]).segment(2, 5)
    assert packed.as_list() is None and packed.to_list() == IDS[2:5]
