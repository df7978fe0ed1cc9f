"""Block keys (docs/key-format.md) computed by the Python backend: one hashlib call per block."""

from __future__ import annotations

from collections.abc import Iterator
from hashlib import sha256
from typing import Any

from kv_api._check import int_in_range
from kv_api.keys import DEFAULT_KEY_FORMAT, Token, check_key_format, reuse_scope_to_bytes
from kv_api.scope import ReuseScope
from kv_core_py.hasher import TokenBlocks

# Copying a fresh context skips OpenSSL's per-call algorithm lookup (~10% per block).
_NEW_SHA256 = sha256().copy


def _prepare(tokens_per_block: Any, reuse_scope: Any, tokens: Any, key_format: Any) -> tuple[bytes, TokenBlocks]:
    tpb = int_in_range("tokens_per_block", tokens_per_block, 1)
    root = sha256(reuse_scope_to_bytes(reuse_scope)).digest()
    fmt = check_key_format(key_format)
    return root, TokenBlocks(tokens, tpb, fmt)


def block_keys(
    tokens_per_block: int,
    reuse_scope: ReuseScope | None,
    tokens: Any,
    key_format: str = DEFAULT_KEY_FORMAT,
) -> bytes:
    key, blocks = _prepare(tokens_per_block, reuse_scope, tokens, key_format)
    keys = [key]
    append = keys.append
    new = _NEW_SHA256
    packed, step = blocks.packed, blocks.step
    if packed is not None:
        # The hot loop, inlined: a generator or a list of slices costs more than the hashing.
        for o in range(0, len(packed), step):
            h = new()
            h.update(key + packed[o : o + step])
            key = h.digest()
            append(key)
        return b"".join(keys)
    for payload in blocks.payloads():
        h = new()
        h.update(key + payload)
        key = h.digest()
        append(key)
    return b"".join(keys)


def _chain(root: bytes, blocks: TokenBlocks) -> Iterator[tuple[list[Token], bytes]]:
    key = root
    yield [], key
    new = _NEW_SHA256
    for block, payload in zip(blocks.blocks(), blocks.payloads(), strict=True):
        h = new()
        h.update(key + payload)
        key = h.digest()
        yield block, key


def sequence_to_blockchain_keys(
    tokens_per_block: int,
    reuse_scope: ReuseScope | None,
    tokens: Any,
    key_format: str = DEFAULT_KEY_FORMAT,
) -> Iterator[tuple[list[Token], bytes]]:
    """Validates everything now; hashes one block per step of the iteration."""
    root, blocks = _prepare(tokens_per_block, reuse_scope, tokens, key_format)
    return _chain(root, blocks)
