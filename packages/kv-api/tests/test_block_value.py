"""The remote tier's value format (kv_api.block_value): what a header holds, that every value of a
layout has one length, and that the fingerprint and namespace tell layouts and models apart."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    KVCacheManagerConfig,
    SsmLayerConfig,
    block_value,
)
from kv_api.block_value import (
    VALUE_MAGIC,
    encode_value,
    header_size,
    layout_fingerprint,
    payload_ok,
    read_header,
    read_place,
    store_namespace,
    value_size,
)

KEY, PARENT, PRINT = bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96))


def config(
    size: int = 64, window: int | None = None, tpb: int = 4, key_format: str = "sha256-u32"
) -> KVCacheManagerConfig:
    layer = AttentionLayerConfig(0, [BufferConfig("key", size), BufferConfig("value", 64)], window)
    return KVCacheManagerConfig(tpb, [GpuCacheTierConfig(1 << 20)], [layer], key_format=key_format)


@given(
    st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=40)), min_size=1, max_size=4), st.integers(0, 2**40)
)
def test_a_value_round_trips(pages: list[bytes | None], prefix: int) -> None:
    sizes = [len(p) if p is not None else 7 for p in pages]
    value = encode_value(PRINT, KEY, PARENT, prefix, 4, pages, sizes)
    assert len(value) == value_size(sizes)
    header = read_header(value)
    assert header is not None
    assert (header.fingerprint, header.key, header.parent, header.prefix_tokens, header.num_tokens) == (
        PRINT,
        KEY,
        PARENT,
        prefix,
        4,
    )
    assert header.lengths == tuple(0 if p is None else len(p) for p in pages)
    body = value[header.size :]
    assert body == b"".join(bytes(s) if p is None else p for p, s in zip(pages, sizes, strict=True))
    # the header's CRC-32 (zlib's) of what precedes it, then the payload's, as little-endian u32s
    assert struct.unpack_from("<II", value, header.size - 8) == (zlib.crc32(value[: header.size - 8]), zlib.crc32(body))
    assert header.payload_crc == zlib.crc32(body) and payload_ok(value, header)


def test_a_damaged_value_fails_its_checks() -> None:
    value = bytearray(encode_value(PRINT, KEY, PARENT, 8, 4, [bytes(range(64)), None], [64, 16]))
    header = read_header(value)
    assert header is not None and payload_ok(value, header)
    for at in (8, 40, 72, 104, 112, 120, header.size - 8):  # each field of the header, its own checksum too
        damaged = bytearray(value)
        damaged[at] ^= 1
        assert read_header(damaged) is None, at
    for at in (header.size, header.size + 63, len(value) - 1):  # the payload: the header still reads
        damaged = bytearray(value)
        damaged[at] ^= 0x80
        assert read_header(damaged) == header and not payload_ok(damaged, header), at


def test_read_header_refuses_what_is_not_a_value() -> None:
    value = encode_value(PRINT, KEY, PARENT, 8, 4, [b"ab"], [2])
    assert value.startswith(VALUE_MAGIC)
    assert read_header(b"") is None
    assert read_header(value[: header_size(1) - 1]) is None  # cut inside the header
    assert read_header(b"XXXX" + value[4:]) is None
    assert read_header(value[:4] + b"\x01\x00" + value[6:]) is None  # another version (format 1)
    assert read_header(value[:6] + b"\x00\x00" + value[8:]) is None  # a header size that lies


def test_read_place_is_the_headers_fixed_part() -> None:
    value = encode_value(PRINT, KEY, PARENT, 40, 8, [b"ab"], [2])
    assert read_place(value) == (KEY, PARENT, 40, 8)
    assert read_place(memoryview(value)) == (KEY, PARENT, 40, 8)
    assert read_place(value[:100]) is None  # cut inside the fixed part (120 bytes)
    assert read_place(b"XXXX" + value[4:]) is None
    assert read_place(value[:4] + b"\x01\x00" + value[6:]) is None  # another version (format 1)


def test_the_fingerprint_names_the_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    base = layout_fingerprint(config())
    assert layout_fingerprint(config()) == base
    for other in (config(size=128), config(window=8), config(tpb=8), config(key_format="sha256-u64")):
        assert layout_fingerprint(other) != base
    ssm = KVCacheManagerConfig(
        4, [GpuCacheTierConfig(1 << 20)], [SsmLayerConfig(0, [BufferConfig("key", 64)])], commit_min_snapshot=True
    )
    assert layout_fingerprint(ssm) != base
    monkeypatch.setattr(block_value, "VALUE_VERSION", block_value.VALUE_VERSION - 1)
    assert layout_fingerprint(config()) != base  # another value format: another namespace


def test_the_namespace_names_model_revision_and_layout() -> None:
    ns = store_namespace("llama", "main", config())
    assert ns.startswith(b"kvcore:llama@main:") and ns.endswith(b":")
    assert ns[len(b"kvcore:llama@main:") : -1] == layout_fingerprint(config()).hex()[:16].encode()
    assert len({ns, store_namespace("llama", "v2", config()), store_namespace("other", "main", config())}) == 3
