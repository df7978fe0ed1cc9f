"""``kv_api.keys`` against docs/key-format.md: the key chain derived here straight from the spec's
text, the documented rejections (class and message) and argument order. Backends are held to
``kv_api.keys`` and the golden vectors by the conformance suite."""

from __future__ import annotations

import hashlib
from array import array
from typing import Any

import pytest

from kv_api import MmItemContext, ReuseScope
from kv_api import keys as ref

DIGEST = bytes(range(32))


def spec_scope_bytes(scope: ReuseScope) -> bytes:
    """One mask byte (bit 0 lora_id, bit 1 salt), then each present field as a u64 LE, lora first."""
    mask = (scope.lora_id is not None) | (scope.salt is not None) << 1
    fields = [f for f in (scope.lora_id, scope.salt) if f is not None]
    return bytes([mask]) + b"".join(f.to_bytes(8, "little") for f in fields)


def spec_keys(tpb: int, scope: ReuseScope, tokens: list[Any], width: int) -> list[bytes]:
    """``root = SHA256(scope bytes)``, ``key[i] = SHA256(key[i-1] || token bytes of block i)``."""
    keys = [hashlib.sha256(spec_scope_bytes(scope)).digest()]
    for start in range(0, len(tokens), tpb):
        data = b"".join(
            t.digest if isinstance(t, MmItemContext) else t if isinstance(t, bytes) else t.to_bytes(width, "little")
            for t in tokens[start : start + tpb]
        )
        keys.append(hashlib.sha256(keys[-1] + data).digest())
    return keys


CASES: list[tuple[str, int, ReuseScope, list[Any], str]] = [
    ("empty", 4, ReuseScope(), [], "sha256-u32"),
    ("full and partial blocks", 4, ReuseScope(), list(range(6)), "sha256-u32"),
    ("lora and salt", 3, ReuseScope(7, 11), list(range(9)), "sha256-u32"),
    ("salt only", 2, ReuseScope(None, 0), [5], "sha256-u32"),
    ("lora 0 is not None", 2, ReuseScope(0, None), [5], "sha256-u32"),
    ("largest u32 id", 1, ReuseScope(), [2**31 - 1], "sha256-u32"),
    ("u64 ids", 2, ReuseScope(), [1, 2**40, 2**64 - 1], "sha256-u64"),
    ("digest tokens", 3, ReuseScope(salt=1), [1, DIGEST, 2, MmItemContext(DIGEST, "img"), 3], "sha256-u32"),
    ("digest tokens u64", 2, ReuseScope(), [DIGEST, 2**63], "sha256-u64"),
]


@pytest.mark.parametrize(("tpb", "scope", "tokens", "key_format"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_keys_follow_the_spec(tpb: int, scope: ReuseScope, tokens: list[Any], key_format: str) -> None:
    width = {"sha256-u32": 4, "sha256-u64": 8}[key_format]
    expected = spec_keys(tpb, scope, tokens, width)
    assert ref.reuse_scope_to_bytes(scope) == spec_scope_bytes(scope)
    assert ref.block_keys(tpb, scope, tokens, key_format) == b"".join(expected)
    pairs = list(ref.sequence_to_blockchain_keys(tpb, scope, tokens, key_format))
    assert [k for _, k in pairs] == expected
    blocks = [
        [t.digest if isinstance(t, MmItemContext) else t for t in tokens[i : i + tpb]]
        for i in range(0, len(tokens), tpb)
    ]
    assert [b for b, _ in pairs] == [[], *blocks]


def test_none_is_not_zero() -> None:
    scopes = [ReuseScope(), ReuseScope(0, None), ReuseScope(None, 0), ReuseScope(0, 0)]
    assert len({ref.block_keys(4, s, []) for s in scopes}) == len(scopes)
    assert ref.reuse_scope_to_bytes(None) == ref.reuse_scope_to_bytes(ReuseScope()) == b"\x00"


def test_salt_ids_and_event_hash_forms() -> None:
    key = hashlib.sha256(b"block").digest()
    assert ref.block_hash_v2_sha256(key) == key.hex()
    assert ref.block_hash_v2_sha256_64(key) == int.from_bytes(key[:8], "big")
    for salt in ("", "tenant-a", "ünïcødé"):
        assert ref.cache_salt_to_id(salt) == int.from_bytes(hashlib.sha256(salt.encode()).digest()[:8], "little")


def test_multimodal_item_tokens() -> None:
    assert ref.gen_multimodal_cache_key_tokens(1000, DIGEST, 3) == [DIGEST, 1001, 1002]
    assert ref.gen_multimodal_cache_key_tokens(1000, DIGEST, 2, 5) == [1005, 1006]
    (item, token) = ref.gen_multimodal_cache_key_tokens(1000, DIGEST, 2, 0, "img-1")
    assert isinstance(item, MmItemContext) and (item.digest, item.uuid, token) == (DIGEST, "img-1", 1001)


#: docs/key-format.md, "Token input": the rejected inputs, the class and how the message starts.
REJECTED: list[tuple[str, Any, str, type[Exception], str]] = [
    ("negative id", [1, -1], "sha256-u32", ValueError, "token 1: id -1 out of range for sha256-u32"),
    ("2**31 in u32", [2**31], "sha256-u32", ValueError, "token 0: id 2147483648 out of range for sha256-u32"),
    ("2**64 in u64", [0, 0, 2**64], "sha256-u64", ValueError, "token 2: id 18446744073709551616 out of range"),
    ("bool", [1, True], "sha256-u32", TypeError, "token 1: bool is not a token id"),
    ("31-byte digest", [b"x" * 31], "sha256-u32", ValueError, "token 0: a digest token must be 32 bytes"),
    ("float", [1.5], "sha256-u32", TypeError, "token 0: expected an int or a 32-byte digest"),
    ("bytearray", [bytearray(32)], "sha256-u32", TypeError, "token 0: expected an int or a 32-byte digest"),
    ("float buffer", array("d", [1.0]), "sha256-u32", TypeError, "tokens: a token buffer must hold 4- or 8-byte"),
    ("int16 buffer", array("h", [1]), "sha256-u32", TypeError, "tokens: a token buffer must hold 4- or 8-byte"),
    ("bytes", b"\x00\x01\x02\x03", "sha256-u32", TypeError, "tokens: a token buffer must hold 4- or 8-byte"),
    (
        "2-D buffer",
        memoryview(bytes(16)).cast("i", (2, 2)),
        "sha256-u32",
        TypeError,
        "tokens: a token buffer must be 1-D",
    ),
    ("str", "123", "sha256-u32", TypeError, "tokens: expected a buffer or an iterable of tokens"),
    ("dict", {1: 2}, "sha256-u32", TypeError, "tokens: expected a buffer or an iterable of tokens"),
    ("int", 5, "sha256-u32", TypeError, "tokens: expected a buffer or an iterable of tokens"),
]


@pytest.mark.parametrize(
    ("tokens", "key_format", "error", "message"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED]
)
def test_documented_rejections(tokens: Any, key_format: str, error: type[Exception], message: str) -> None:
    for call in (ref.block_keys, ref.sequence_to_blockchain_keys):
        with pytest.raises(error) as info:
            call(4, None, tokens, key_format)
        assert type(info.value) is error and str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((0, 7, [-1], "nope"), ValueError, "tokens_per_block"),
        ((4, 7, [-1], "nope"), TypeError, "reuse_scope"),
        ((4, None, [-1], "nope"), ValueError, "key_format"),
        ((4, None, [-1], 5), TypeError, "key_format"),
        ((4, None, [-1], "sha256-u32"), ValueError, "token 0"),
    ],
    ids=["tokens_per_block", "reuse_scope", "key_format", "key_format type", "tokens"],
)
def test_the_first_bad_argument_is_reported(args: tuple[Any, ...], error: type[Exception], message: str) -> None:
    """Order: tokens_per_block, reuse_scope, key_format, then tokens."""
    with pytest.raises(error) as info:
        ref.block_keys(*args)
    assert type(info.value) is error and str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(("lora", "salt"), [(-1, None), (None, 2**64), (True, None), (None, 1.0)])
def test_reuse_scope_fields_are_u64(lora: Any, salt: Any) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        ReuseScope(lora, salt)
    assert str(info.value).startswith("ReuseScope.")
