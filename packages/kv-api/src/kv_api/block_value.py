"""The bytes a remote tier stores per block (docs/store.md, "Values"): a header that names the
block and the layout, then the block's pages. Both backends write and check exactly these bytes,
so a fleet's managers share a store whatever their backend.

Header (little-endian)::

    offset  size  field
    0       4     magic b"KVCB"
    4       2     format version (1)
    6       2     header size in bytes (this header, its lengths and its checksum)
    8       32    layout fingerprint (``layout_fingerprint``)
    40      32    the block's chained key (salt and LoRA scope already in it)
    72      32    its parent's key (the scope's root key for a chain's first block)
    104     8     prefix tokens: tokens of the chain up to and including this block
    112     4     tokens in this block (a full block: ``tokens_per_block``)
    116     4     number of layer groups, G
    120     8*G   per layer group, the bytes of its page in the payload (0: no page, zeros)
    120+8G  4     CRC-32 (zlib's) of every header byte before it
    124+8G  4     CRC-32 (zlib's) of the payload

The payload follows: per layer group in order, its page's bytes pool by pool (the slot layout
of ``pool_group_descs``); a layer group without a page has zeros of its page size there, so
every value of a layout has the same length (``value_size``).

The checksums catch a torn, truncated or corrupted value (CRC-32 finds every error of up to 32
bits in a row, and misses random damage once in 2^32); like any unkeyed checksum they are no
defence against a writer who means harm: the store is trusted like the engine's own memory
(docs/store.md). Format 1 carried a SHA-256 there: at ~1 GB/s it was most of what a write-through
cost the engine's thread, where CRC-32 runs at memory speed (carry-less multiply, ARMv8 CRC)."""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from kv_api.config import AttentionLayerConfig, KVCacheManagerConfig

__all__ = [
    "VALUE_MAGIC",
    "VALUE_VERSION",
    "ValueHeader",
    "encode_value",
    "header_size",
    "layout_fingerprint",
    "payload_ok",
    "read_header",
    "read_place",
    "store_namespace",
    "value_size",
]

VALUE_MAGIC = b"KVCB"
VALUE_VERSION = 2
_FIXED = struct.Struct("<4sHH32s32s32sQII")  # everything before the lengths
_CRC = struct.Struct("<II")  # the header's CRC-32, the payload's


def header_size(num_layer_groups: int) -> int:
    return _FIXED.size + 8 * num_layer_groups + _CRC.size


def value_size(page_sizes: Sequence[int]) -> int:
    """The length of every value of a layout whose layer groups' pages are ``page_sizes`` bytes."""
    return header_size(len(page_sizes)) + sum(page_sizes)


def layout_fingerprint(config: KVCacheManagerConfig) -> bytes:
    """SHA-256 of what decides a value's bytes: the value format, key format, tokens per block,
    and each layer's kind, id, window, sinks and buffers (role, size, block-size override), in
    config order. With the format in it, values of another format live under another namespace: a
    fleet that upgrades never reads them, and its ``SET NX`` never finds their keys taken."""
    parts = [f"kvcore-layout-1;value-format-{VALUE_VERSION};{config.key_format};{config.tokens_per_block}"]
    for layer in config.layers:
        if isinstance(layer, AttentionLayerConfig):
            kind = f"attention,{layer.sliding_window_size},{layer.num_sink_tokens}"
        else:
            kind = "ssm"
        buffers = ",".join(f"{b.role}:{b.size}:{b.tokens_per_block_override}" for b in layer.buffers)
        parts.append(f"{layer.layer_id},{kind},[{buffers}]")
    return hashlib.sha256(";".join(parts).encode()).digest()


def store_namespace(model_id: str, revision: str, config: KVCacheManagerConfig) -> bytes:
    """The prefix of every store key of this model and layout: ``kvcore:<model>@<revision>:<16
    hex digits of the layout fingerprint>:``, then the block's 32-byte key."""
    return f"kvcore:{model_id}@{revision}:{layout_fingerprint(config).hex()[:16]}:".encode()


@dataclass(frozen=True)
class ValueHeader:
    version: int
    fingerprint: bytes
    key: bytes
    parent: bytes
    prefix_tokens: int
    num_tokens: int
    lengths: tuple[int, ...]
    payload_crc: int  # CRC-32 of the payload (``payload_ok``)

    @property
    def size(self) -> int:
        return header_size(len(self.lengths))


def read_header(value: bytes | bytearray | memoryview) -> ValueHeader | None:
    """The header of ``value``, or None where its magic, version, sizes or checksum are wrong.
    Stores may read it (a block's parent and depth order their eviction); the manager checks the
    rest, the payload too (``payload_ok``)."""
    view = memoryview(value).cast("B")
    if len(view) < _FIXED.size:
        return None
    magic, version, size, fingerprint, key, parent, prefix, tokens, groups = _FIXED.unpack_from(view)
    if magic != VALUE_MAGIC or version != VALUE_VERSION or size != header_size(groups) or len(view) < size:
        return None
    header_crc, payload_crc = _CRC.unpack_from(view, size - _CRC.size)
    if zlib.crc32(view[: size - _CRC.size]) != header_crc:
        return None
    lengths = struct.unpack_from(f"<{groups}Q", view, _FIXED.size)
    return ValueHeader(version, fingerprint, key, parent, prefix, tokens, lengths, payload_crc)


def payload_ok(value: bytes | bytearray | memoryview, header: ValueHeader) -> bool:
    """Whether the payload of ``value`` (its bytes past ``header``, ``read_header``'s) is the one
    its checksum names."""
    return zlib.crc32(memoryview(value).cast("B")[header.size :]) == header.payload_crc


def read_place(value: bytes | bytearray | memoryview) -> tuple[bytes, bytes, int, int] | None:
    """A value's key, parent key, prefix tokens and block tokens, from the fixed part of its
    header alone (None where its magic or version is wrong): what a store reads of every block
    it writes to order its chains, at a tenth of ``read_header``'s cost."""
    size = value.nbytes if isinstance(value, memoryview) else len(value)
    if size < _FIXED.size:
        return None
    magic, version, _, _, key, parent, prefix, tokens, _ = _FIXED.unpack_from(value)
    if magic != VALUE_MAGIC or version != VALUE_VERSION:
        return None
    return key, parent, prefix, tokens


def encode_value(
    fingerprint: bytes,
    key: bytes,
    parent: bytes,
    prefix_tokens: int,
    num_tokens: int,
    pages: Sequence[bytes | None],
    page_sizes: Sequence[int],
) -> bytes:
    """A value: the header, then each layer group's page (``None``: zeros, length 0)."""
    lengths = [0 if p is None else len(p) for p in pages]
    head = _FIXED.pack(
        VALUE_MAGIC,
        VALUE_VERSION,
        header_size(len(pages)),
        fingerprint,
        key,
        parent,
        prefix_tokens,
        num_tokens,
        len(pages),
    ) + struct.pack(f"<{len(pages)}Q", *lengths)
    payload = b"".join(bytes(size) if p is None else p for p, size in zip(pages, page_sizes, strict=True))
    return head + _CRC.pack(zlib.crc32(head), zlib.crc32(payload)) + payload
