"""Block values with real headers (``kv_api.block_value``) for the kv-store tests."""

from __future__ import annotations

import hashlib
import random

from kv_api.block_store import BlockStore
from kv_api.block_value import encode_value, header_size

NAMESPACE = b"kvcore:test-model@main:0123456789abcdef:"
FINGERPRINT = hashlib.sha256(b"kv-store tests").digest()
TOKENS = 16

Chain = tuple[list[bytes], list[bytes]]  # (store keys, values), first block first


def make_chain(n: int, size: int = 4096, *, parent: bytes = bytes(32), depth: int = 0, seed: int = 0) -> Chain:
    """``n`` consecutive blocks of one chain, each value ``size`` bytes with a random payload,
    the first one a child of ``parent`` at ``depth`` blocks (0: a chain's first block)."""
    rng = random.Random(seed)
    keys, values = [], []
    page = size - header_size(1)
    for i in range(n):
        key = hashlib.sha256(parent + seed.to_bytes(8, "little") + i.to_bytes(4, "little")).digest()
        prefix = (depth + i + 1) * TOKENS
        values.append(encode_value(FINGERPRINT, key, parent, prefix, TOKENS, [rng.randbytes(page)], [page]))
        keys.append(NAMESPACE + key)
        parent = key
    return keys, values


def raw_key(key: bytes) -> bytes:
    """The block's chained key (the header's ``key``) in a store key."""
    return key[len(NAMESPACE) :]


def buffers_for(values: list[bytes]) -> list[memoryview]:
    return [memoryview(bytearray(len(v))) for v in values]


def round_trip(store: BlockStore, keys: list[bytes], values: list[bytes]) -> None:
    """Puts a chain, waits for its writes (``flush``), and checks every block is there and reads
    back byte for byte."""
    store.put(keys, values)
    assert store.flush()  # type: ignore[attr-defined]
    assert store.contains(keys) == len(keys)
    buffers = buffers_for(values)
    assert store.get_into(keys, buffers) == len(keys)
    assert [bytes(b) for b in buffers] == values
