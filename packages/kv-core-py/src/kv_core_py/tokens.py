"""Tokens as the key functions and the manager read them (C++ ``tokens.h``): validated once, and
packed when they can be, the fastest honest pure-Python route from tokens to key bytes.

Int-only inputs are packed once into the key format's little-endian encoding with C-speed
bytes operations (range checks included), so hashing a block is one ``hashlib`` call over a
slice; ``int_segments`` does the same for a long list, a segment at a time. Inputs with digest
tokens, bools or int-likes go through ``kv_api.keys``' general path, which also produces every
error message, so errors are identical by construction.
"""

from __future__ import annotations

import marshal
import sys
from array import array
from operator import countOf
from typing import Any, cast

from kv_api.keys import TOKEN_ENCODING, Token, buffer_int_code, check_mm_item, encode_block, token_list
from kv_api.scope import MmItemContext

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


#: From this many items marshal packs a list faster than type() and array('I') (its fixed cost
#: is higher, its cost per item lower).
MARSHAL_FROM = 512


def _pack_u32(items: list[Any]) -> bytes | None:
    if len(items) < MARSHAL_FROM:
        packed = _pack_exact(items, "I")  # [0, 2**32)
        return packed if packed is not None and _high_bit_clear(packed, 3, 4) else None
    # marshal (format 2) writes n ints in [-2**31, 2**31) as a 5-byte header and 5 bytes each:
    # b"i", then the value as 4 LE bytes. Any other item (a bool, an int subclass or a larger
    # int, a digest, an int-like) gets another type byte, and the first one sits where an b"i"
    # is expected, so checking every fifth byte is exact. One C pass checks the type and reads
    # the value, without touching reference counts and without running Python code.
    try:
        raw = marshal.dumps(items, 2)
    except ValueError:  # an item marshal cannot write (an int subclass, an arbitrary object)
        return None
    n = len(items)
    # Bit 31 clear: no negative ids, and u32 ids must be < 2**31.
    if len(raw) != 5 + 5 * n or raw[5::5].count(b"i") != n or not _high_bit_clear(raw, 9, 5):
        return None
    out = bytearray(4 * n)
    for b in range(4):
        out[b::4] = raw[6 + b :: 5]
    return bytes(out)


def _pack_exact(items: list[Any], code: str) -> bytes | None:
    # Exact ints only (digests, bools and int-likes: the general path decides). Counting the
    # types equal to int costs two thirds of building a set of them; a type is equal to int
    # only when it is int, short of a metaclass whose __eq__ says otherwise.
    if countOf(map(type, items), int) != len(items):
        return None
    packed = array(code)
    try:
        packed.fromlist(items)  # a third faster than array(code, items)
    except OverflowError:
        return None
    return packed.tobytes()


def pack_ints(items: list[Any], key_format: str) -> bytes | None:
    """``items`` encoded for ``key_format`` if every one is a plain int in range, else None
    (the general path then decides: digests, int-likes, and every error)."""
    if not _FAST:
        return None
    return _pack_u32(items) if TOKEN_ENCODING[key_format][0] == 4 else _pack_exact(items, "Q")


def pack_tokens(tokens: Any, key_format: str) -> bytes | None:
    """A token buffer encoded for ``key_format`` if every id is in range, else None (lists and
    tuples are packed by ``Tokens``; other iterables are consumed by the general path)."""
    if not _FAST:
        return None
    try:
        mv = memoryview(tokens)
    except TypeError:
        return None
    return _pack_buffer(mv, key_format)


class Tokens:
    """Validated tokens: ``packed`` (every id in the key format's encoding, ``width`` bytes each)
    when all are plain ints, else None and a list of ints and 32-byte digests. A list or tuple of
    plain ints is also kept as a list (a shallow copy: the caller may change its own), so
    ``to_list`` slices it instead of unpacking new int objects."""

    __slots__ = ("_list", "key_format", "packed", "width")

    def __init__(self, tokens: Any, key_format: str) -> None:
        self.key_format = key_format
        self.width = TOKEN_ENCODING[key_format][0]
        self._list: list[Token] | None = None
        if _FAST and isinstance(tokens, (list, tuple)):
            # One copy, packed and kept: packing runs no Python code on a list of exact ints,
            # so the copy is the caller's list as it is now.
            ids = list(tokens)
            self.packed = pack_ints(ids, key_format)
            if self.packed is not None:
                self._list = ids
        else:
            self.packed = pack_tokens(tokens, key_format)
        if self.packed is None:
            self._list = token_list(tokens, key_format)  # the original: the general path's rules

    @classmethod
    def checked(cls, key_format: str, packed: bytes | None, ids: list[Token] | None) -> Tokens:
        """Tokens already validated and packed (``segment``, ``int_segments``)."""
        self = cls.__new__(cls)
        self.key_format = key_format
        self.width = TOKEN_ENCODING[key_format][0]
        self.packed = packed
        self._list = ids
        return self

    def segment(self, begin: int, end: int) -> Tokens:
        """Tokens ``[begin, end)``: the kept list and the packed ids sliced, nothing unpacked."""
        w = self.width
        packed = None if self.packed is None else self.packed[begin * w : end * w]
        return Tokens.checked(self.key_format, packed, None if self._list is None else self._list[begin:end])

    def __len__(self) -> int:
        if self.packed is not None:
            return len(self.packed) // self.width
        assert self._list is not None
        return len(self._list)

    def as_list(self) -> list[Token] | None:
        """The tokens as ints and digests when a list of them is kept (not a copy: slice it, do
        not change it), else None (packed from a buffer)."""
        return self._list

    def to_list(self, begin: int = 0, end: int | None = None) -> list[Token]:
        """Tokens ``[begin, end)`` as ints and digests; packed ids are unpacked in C."""
        if self._list is not None:
            return self._list[begin:end]
        assert self.packed is not None
        w = self.width
        ids = memoryview(self.packed)[begin * w : None if end is None else end * w]
        return cast(list[Token], ids.cast("I" if w == 4 else "Q").tolist())

    def payload(self, begin: int, end: int) -> bytes:
        """What tokens ``[begin, end)`` put into a block key after the parent key."""
        if self.packed is not None:
            return self.packed[begin * self.width : end * self.width]
        assert self._list is not None
        return encode_block(self._list[begin:end], self.key_format)


def int_segments(tokens: list[Any] | tuple[Any, ...], key_format: str, size: int) -> list[Tokens] | None:
    """A list or tuple of plain ints in range as Tokens of ``size`` tokens each (the last may be
    shorter), or None where any token needs the general path, which also raises every error.

    Each segment is copied and packed while its ints are in cache and is its own allocation,
    freed once iterated. Packing runs no Python code, but some may run between two segments (a
    collector callback, another thread) and change the list: a segment that does not have its
    expected length returns None, and the caller reads the list again in one go
    (docs/architecture.md, "The Python backend reads a long list in segments").
    """
    n = len(tokens)
    out = []
    for begin in range(0, n, size):
        part = tokens[begin : begin + size]
        ids = part if type(part) is list else list(part)
        packed = pack_ints(ids, key_format) if len(ids) == min(size, n - begin) else None
        if packed is None:
            return None
        out.append(Tokens.checked(key_format, packed, cast(list[Token], ids)))
    return out


def gen_multimodal_cache_key_tokens(
    id_offset: int,
    digest: bytes,
    num_tokens: int,
    token_offset: int = 0,
    uuid: str | None = None,
) -> list[Token | MmItemContext]:
    """Tokens ``token_offset ..`` of one multimodal item (docs/key-format.md): item-local token 0
    is the digest (an ``MmItemContext`` carrying ``uuid`` when one is given), token ``j`` is
    ``id_offset + j``."""
    offset, n, start = check_mm_item(id_offset, digest, num_tokens, token_offset)
    # Built whether or not token_offset leaves the digest out: arguments are checked left to
    # right whatever their use, so a bad uuid always fails (docs/errors.md, "Order").
    first: Token | MmItemContext = digest if uuid is None else MmItemContext(digest, uuid)
    out: list[Token | MmItemContext] = list(range(offset + start, offset + start + n))
    if start == 0:
        out[0] = first
    return out
