"""The forms a block key takes in KV-cache events, and the salt id of a tenant's cache salt
(docs/key-format.md; C++ ``event_hash.h``). Arguments are checked by ``kv_api``'s checks, so
errors match the reference by construction."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from hashlib import sha256

from kv_api._check import as_str, int_in_range
from kv_api.keys import check_digest, check_reuse_scope, v1_token_ids
from kv_api.scope import ReuseScope

_M32 = (1 << 32) - 1
_M64 = (1 << 64) - 1


def cache_salt_to_id(cache_salt: str) -> int:
    """First 8 bytes of SHA-256(utf-8) read little-endian: the ``ReuseScope`` salt of a cache salt."""
    salt_id: int = struct.unpack_from("<Q", sha256(as_str("cache_salt", cache_salt).encode("utf-8")).digest())[0]
    return salt_id


def block_hash_v2_sha256(key: bytes) -> str:
    """``v2_sha256``: the key as 64 lowercase hex characters."""
    return check_digest("key", key).hex()


def block_hash_v2_sha256_64(key: bytes) -> int:
    """``v2_sha256_64``: the first 8 key bytes read big-endian (unlike the salt id)."""
    hash_64: int = struct.unpack_from(">Q", check_digest("key", key))[0]
    return hash_64


def _mix64(value: int, seed: int) -> int:
    v = value
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & _M64
    v ^= v >> 31
    return (seed ^ (v + 0x9E3779B9 + (seed << 6) + (seed >> 2))) & _M64


def block_hash_v1(tokens: Iterable[int], parent_hash: int, reuse_scope: ReuseScope | None = None) -> int:
    """``v1_block_key``: the legacy 64-bit mix of a block of int tokens under ``parent_hash`` (0
    under the root, where the salt enters; the LoRA id enters every block). A block with a
    digest token has none (``ValueError``)."""
    scope = check_reuse_scope(reuse_scope)
    parent = int_in_range("parent_hash", parent_hash, 0, 1 << 64)
    ids = v1_token_ids(tokens)
    seed = (len(ids) ^ (parent * 0xBF58476D1CE4E5B9)) & _M64
    if parent == 0 and scope.salt is not None:
        seed = _mix64(scope.salt, seed)
    for token in ids:
        # mix32, inlined: it runs once per token.
        v = token & _M32
        v = (((v >> 16) ^ v) * 0x45D9F3B) & _M32
        v = (((v >> 16) ^ v) * 0x45D9F3B) & _M32
        v = (((v >> 16) ^ v) + 0x9E3779B9) & _M32
        seed = (seed ^ (v + (seed << 6) + (seed >> 2))) & _M64
    if scope.lora_id is not None:
        seed = _mix64(scope.lora_id, seed)
    return seed
