"""Token packing for block keys: the fastest honest pure-Python route from tokens to key bytes.

Int-only inputs are packed once into the key format's little-endian encoding with C-speed
bytes operations (range checks included), so hashing a block is one ``hashlib`` call over a
slice. Inputs with digest tokens, bools or int-likes go through ``kv_api.keys``' general
path, which also produces every error message, so errors are identical by construction.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from typing import Any, Literal

from kv_api.keys import TOKEN_ENCODING, Token, buffer_int_code, encode_block, token_list

_FAST = sys.byteorder == "little"


def _high_bit_clear(raw: bytes, byte: int, width: int) -> bool:
    """No item of ``raw`` (items of ``width`` bytes) has bit 7 of byte ``byte`` set."""
    return raw[byte::width].isascii()


def _zero(raw: bytes, byte: int, width: int) -> bool:
    column = raw[byte::width]
    return column.count(0) == len(column)


def _resize(raw: bytes, width: int, new_width: int) -> bytes:
    """Re-encode LE items from ``width`` to ``new_width`` bytes (values already range-checked)."""
    out = bytearray(len(raw) // width * new_width)
    for b in range(min(width, new_width)):
        out[b::new_width] = raw[b::width]
    return bytes(out)


def _pack_buffer(mv: memoryview, key_format: str) -> bytes | None:
    code = buffer_int_code(mv)  # raises the reference's TypeError for a bad buffer
    # One C-order copy (cheap next to hashing) makes the strided byte checks below fast.
    raw = mv.tobytes()
    width, new_width = mv.itemsize, TOKEN_ENCODING[key_format][0]
    signed = code in "iq"
    if new_width == 4:
        # u32 ids must be < 2**31: bit 31 clear and, for 8-byte items, the high half zero.
        ok = _high_bit_clear(raw, 3, width) and all(_zero(raw, b, width) for b in range(4, width))
    else:
        ok = not signed or _high_bit_clear(raw, width - 1, width)
    if not ok:
        return None
    return raw if width == new_width else _resize(raw, width, new_width)


def _pack_ints(items: list[Any], key_format: str) -> bytes | None:
    if set(map(type, items)) - {int}:
        return None  # digests, bools or int-likes: the general path decides
    try:
        # 'i' takes [-2**31, 2**31) and 'Q' [0, 2**64): only negative u32 ids need a check.
        packed = array("i" if TOKEN_ENCODING[key_format][0] == 4 else "Q", items)
    except OverflowError:
        return None
    raw = packed.tobytes()
    return raw if packed.typecode == "Q" or _high_bit_clear(raw, 3, 4) else None


def pack_tokens(tokens: Any, key_format: str) -> bytes | None:
    """``tokens`` encoded for ``key_format`` if every token is an in-range plain int, else None.

    Only buffers, lists and tuples are tried; other iterables are consumed by the general path.
    """
    if not _FAST:
        return None
    if isinstance(tokens, (list, tuple)):
        return _pack_ints(list(tokens) if isinstance(tokens, tuple) else tokens, key_format)
    try:
        mv = memoryview(tokens)
    except TypeError:
        return None
    return _pack_buffer(mv, key_format)


class TokenBlocks:
    """Validated tokens cut into blocks: each block's key bytes, and its tokens."""

    def __init__(self, tokens: Any, tokens_per_block: int, key_format: str) -> None:
        self._tpb = tokens_per_block
        self._format = key_format
        self._packed = pack_tokens(tokens, key_format)
        self._tokens = token_list(tokens, key_format) if self._packed is None else None

    @property
    def packed(self) -> bytes | None:
        """All token bytes when every token is a plain int (then block ``i`` is a slice), else None."""
        return self._packed

    @property
    def step(self) -> int:
        """Bytes of a full block in ``packed``."""
        return self._tpb * TOKEN_ENCODING[self._format][0]

    def payloads(self) -> Iterator[bytes]:
        """Per block, the bytes its key hashes after the parent key."""
        tpb, fmt, packed = self._tpb, self._format, self._packed
        if packed is not None:
            step = self.step
            return (packed[o : o + step] for o in range(0, len(packed), step))
        tokens = self._tokens
        assert tokens is not None
        return (encode_block(tokens[o : o + tpb], fmt) for o in range(0, len(tokens), tpb))

    def blocks(self) -> Iterator[list[Token]]:
        """Per block, its tokens (ints and 32-byte digests)."""
        tokens: list[Token]
        if self._tokens is not None:
            tokens = self._tokens
        else:
            assert self._packed is not None
            tokens = _unpack(self._packed, self._format)
        tpb = self._tpb
        return (tokens[o : o + tpb] for o in range(0, len(tokens), tpb))


def tokens_of(tokens: Any, key_format: str) -> list[Token]:
    """``kv_api.keys.token_list`` with the fast path: int-only inputs unpacked in C."""
    packed = pack_tokens(tokens, key_format)
    if packed is None:
        return token_list(tokens, key_format)
    return _unpack(packed, key_format)


def _unpack(packed: bytes, key_format: str) -> list[Token]:
    """Packed little-endian ids back to a list of ints, in C."""
    code: Literal["I", "Q"] = "I" if TOKEN_ENCODING[key_format][0] == 4 else "Q"
    return list(memoryview(packed).cast(code).tolist())
