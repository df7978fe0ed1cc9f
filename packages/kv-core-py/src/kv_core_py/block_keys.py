"""Block keys (docs/key-format.md) computed by the Python backend (C++ ``block_keys.h``): one
hashlib call per block, over a slice of the packed tokens when they are plain ints.
``chained_keys`` is the one route: the key functions, the radix tree and the manager use it."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from hashlib import sha256
from itertools import islice
from typing import Any

from kv_api._check import int_in_range
from kv_api.constants import DEFAULT_KEY_FORMAT, ceil_div
from kv_api.keys import Token, check_key_format, check_many_inputs, check_many_scopes, check_reuse_scope, named_item
from kv_api.scope import ReuseScope
from kv_core_py.tokens import Tokens, int_segments

# Copying a fresh context skips OpenSSL's per-call algorithm lookup (~10% per block).
_NEW_SHA256 = sha256().copy


def reuse_scope_to_bytes(reuse_scope: ReuseScope | None) -> bytes:
    """One mask byte (bit 0: lora present, bit 1: salt present), then each present field u64 LE."""
    scope = check_reuse_scope(reuse_scope)
    fields = [v for v in (scope.lora_id, scope.salt) if v is not None]
    mask = (scope.lora_id is not None) | (scope.salt is not None) << 1
    return struct.pack(f"<B{len(fields)}Q", mask, *fields)


def root_key(scope: ReuseScope | None) -> bytes:
    return _NO_SCOPE_ROOT if scope is None else sha256(reuse_scope_to_bytes(scope)).digest()


_NO_SCOPE_ROOT = sha256(reuse_scope_to_bytes(None)).digest()  # the most common root, worked out once


def chained_keys(parent: bytes, tokens: Tokens, first: int, count: int, tokens_per_block: int) -> list[bytes]:
    """``parent`` (the key of block ``first - 1``, or the root), then the keys of blocks
    ``[first, first + count)`` of ``tokens`` (fewer where the tokens end)."""
    keys = [parent]
    append = keys.append
    new = _NEW_SHA256
    key = parent
    packed = tokens.packed
    if packed is not None:
        step = tokens_per_block * tokens.width
        # The hot loop, inlined: a generator or a call per block costs more than the hashing.
        for offset in range(first * step, min(len(packed), (first + count) * step), step):
            h = new()
            h.update(key + packed[offset : offset + step])
            key = h.digest()
            append(key)
        return keys
    for start in range(
        first * tokens_per_block, min(len(tokens), (first + count) * tokens_per_block), tokens_per_block
    ):
        h = new()
        h.update(key + tokens.payload(start, start + tokens_per_block))
        key = h.digest()
        append(key)
    return keys


def _prepare(tokens_per_block: Any, reuse_scope: Any, tokens: Any, key_format: Any) -> tuple[int, bytes, Tokens]:
    tokens_per_block = int_in_range("tokens_per_block", tokens_per_block, 1)
    root = root_key(reuse_scope)
    fmt = check_key_format(key_format)
    return tokens_per_block, root, Tokens(tokens, fmt)


def block_keys(
    tokens_per_block: int,
    reuse_scope: ReuseScope | None,
    tokens: Any,
    key_format: str = DEFAULT_KEY_FORMAT,
) -> bytes:
    tokens_per_block, root, toks = _prepare(tokens_per_block, reuse_scope, tokens, key_format)
    return b"".join(chained_keys(root, toks, 0, ceil_div(len(toks), tokens_per_block), tokens_per_block))


def block_keys_many(
    tokens_per_block: int,
    reuse_scopes: Sequence[ReuseScope | None] | None,
    token_inputs: Sequence[Any],
    key_format: str = DEFAULT_KEY_FORMAT,
) -> list[bytes]:
    """``block_keys`` per input; every argument and input is checked before any hashing, in
    ``kv_api.keys.block_keys_many``'s order (C++ ``block_keys_many``; hashlib has no interleaved form)."""
    tokens_per_block = int_in_range("tokens_per_block", tokens_per_block, 1)
    scopes = check_many_scopes(reuse_scopes)
    fmt = check_key_format(key_format)
    inputs = check_many_inputs(token_inputs, scopes)
    toks = [named_item("token_inputs", i, lambda t: Tokens(t, fmt), t) for i, t in enumerate(inputs)]
    out = []
    for i, t in enumerate(toks):
        root = root_key(None if scopes is None else scopes[i])
        out.append(b"".join(chained_keys(root, t, 0, ceil_div(len(t), tokens_per_block), tokens_per_block)))
    return out


#: Tokens per segment of ``sequence_to_blockchain_keys`` (rounded down to whole blocks, at least
#: one): a segment is checked, packed, hashed and sliced while in cache, and freed once passed.
SEGMENT_TOKENS = 8192


def _blocks(ids: list[Token], tokens_per_block: int) -> Iterator[list[Token]]:
    """``ids`` in blocks, sliced in C (a generator frame resumed per block costs more)."""
    n = len(ids)
    return map(
        ids.__getitem__,
        map(slice, range(0, n, tokens_per_block), range(tokens_per_block, n + tokens_per_block, tokens_per_block)),
    )


def _drain(items: list[Tokens]) -> Iterator[Tokens]:
    """``items`` in order, each released once handed out."""
    items.reverse()
    while items:
        yield items.pop()


def _pairs(root: bytes, segments: Iterator[Tokens], tokens_per_block: int) -> Iterator[tuple[list[Token], bytes]]:
    key = root
    yield [], key
    for seg in segments:
        keys = chained_keys(key, seg, 0, ceil_div(len(seg), tokens_per_block), tokens_per_block)
        key = keys[-1]
        ids = seg.as_list()
        yield from zip(
            _blocks(seg.to_list() if ids is None else ids, tokens_per_block), islice(keys, 1, None), strict=True
        )


def sequence_to_blockchain_keys(
    tokens_per_block: int,
    reuse_scope: ReuseScope | None,
    tokens: Any,
    key_format: str = DEFAULT_KEY_FORMAT,
) -> Iterator[tuple[list[Token], bytes]]:
    """Validates everything now; hashes as the iteration goes, a segment at a time. A list or
    tuple of plain ints is read in segments (``int_segments``); anything else is read whole and
    sliced into segments as it is hashed."""
    tokens_per_block = int_in_range("tokens_per_block", tokens_per_block, 1)
    root = root_key(reuse_scope)
    fmt = check_key_format(key_format)
    size = max(1, SEGMENT_TOKENS // tokens_per_block) * tokens_per_block
    segments = int_segments(tokens, fmt, size) if type(tokens) in (list, tuple) else None
    if segments is not None:
        return _pairs(root, _drain(segments), tokens_per_block)
    toks = Tokens(tokens, fmt)
    return _pairs(root, (toks.segment(b, b + size) for b in range(0, len(toks), size)), tokens_per_block)
