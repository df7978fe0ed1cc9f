"""``Tokens`` reads the same whichever path took the input: packed plain ints, or the general
path's list (digest tokens, int-likes, other iterables)."""

from __future__ import annotations

from array import array

import pytest

from kv_api.constants import KEY_FORMATS
from kv_api.keys import encode_block
from kv_core_py.block_keys import chained_keys, root_key
from kv_core_py.tokens import Tokens

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
