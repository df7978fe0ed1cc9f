"""Bad input to the key functions: the same class and message as the reference, on every backend."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pytest

import kv_api
from kv_api import ReuseScope
from kv_api import keys as ref
from kv_api.constants import SHA256_U32

TPB = 4
BIG = 2**64
BAD_TOKENS: list[tuple[str, Any, str]] = [
    ("negative", [1, 2, -1], "sha256-u32"),
    ("2**31 in u32", [0, 2**31], "sha256-u32"),
    ("2**64 in u64", [BIG], "sha256-u64"),
    ("negative in u64", [-5], "sha256-u64"),
    ("huge negative", [-(2**70)], "sha256-u32"),
    ("bool", [1, True], "sha256-u32"),
    ("float", [1.5], "sha256-u32"),
    ("str item", ["1"], "sha256-u32"),
    ("None item", [None], "sha256-u32"),
    ("bytearray digest", [bytearray(32)], "sha256-u32"),
    ("31-byte digest", [b"x" * 31], "sha256-u32"),
    ("33-byte digest", [1, b"x" * 33], "sha256-u64"),
    ("str tokens", "123", "sha256-u32"),
    ("dict tokens", {1: 2}, "sha256-u32"),
    ("int tokens", 5, "sha256-u32"),
    ("None tokens", None, "sha256-u32"),
    ("bytes tokens", b"\x00\x01\x02\x03", "sha256-u32"),
    ("float32 buffer", np.zeros(3, dtype=np.float32), "sha256-u32"),
    ("float64 buffer", array("d", [1.0]), "sha256-u32"),
    ("int16 buffer", array("h", [1]), "sha256-u32"),
    ("2-D buffer", np.zeros((2, 2), dtype=np.int32), "sha256-u32"),
    ("0-D buffer", np.int32(5), "sha256-u32"),
    ("big-endian buffer", np.zeros(3, dtype=">i4"), "sha256-u32"),
    ("negative in int32 buffer", np.array([0, 5, -3], dtype=np.int32), "sha256-u32"),
    ("negative in int32 buffer u64", np.array([0, -3], dtype=np.int32), "sha256-u64"),
    ("2**31 in uint32 buffer", np.array([2**31], dtype=np.uint32), "sha256-u32"),
    ("2**40 in int64 buffer", np.array([1, 2**40], dtype=np.int64), "sha256-u32"),
    ("negative in int64 buffer u64", np.array([-1], dtype=np.int64), "sha256-u64"),
    ("2**63 in uint64 buffer", np.array([2**63], dtype=np.uint64), "sha256-u32"),
    ("negative in strided buffer", np.array([0, 0, -1, 0], dtype=np.int32)[::2], "sha256-u32"),
]


def outcome(call: Any) -> tuple[type[BaseException], str] | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the class and message are what we compare
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize(("tokens", "key_format"), [c[1:] for c in BAD_TOKENS], ids=[c[0] for c in BAD_TOKENS])
def test_bad_tokens(backend: kv_api.Backend, tokens: Any, key_format: str) -> None:
    expected = outcome(lambda: ref.block_keys(4, None, tokens, key_format))
    assert expected is not None and expected[0] in (ValueError, TypeError)
    assert outcome(lambda: backend.block_keys(4, None, tokens, key_format)) == expected
    assert outcome(lambda: backend.sequence_to_blockchain_keys(4, None, tokens, key_format)) == expected


BAD_ARGS: list[tuple[str, tuple[Any, ...]]] = [
    ("tpb 0", (0, None, [1])),
    ("tpb negative", (-3, None, [1])),
    ("tpb bool", (True, None, [1])),
    ("tpb float", (4.0, None, [1])),
    ("tpb str", ("4", None, [1])),
    ("scope tuple", (4, (1, 2), [1])),
    ("scope int", (4, 7, [1])),
    ("format unknown", (4, None, [1], "sha256")),
    ("format bytes", (4, None, [1], b"sha256-u32")),
    ("tpb checked before tokens", (0, None, [-1])),
    ("scope checked before format", (4, 1, [1], "nope")),
]


@pytest.mark.parametrize("args", [c[1] for c in BAD_ARGS], ids=[c[0] for c in BAD_ARGS])
def test_bad_arguments(backend: kv_api.Backend, args: tuple[Any, ...]) -> None:
    expected = outcome(lambda: ref.block_keys(*args))
    assert expected is not None
    assert outcome(lambda: backend.block_keys(*args)) == expected


def test_index_protocol_ints_are_accepted(backend: kv_api.Backend) -> None:
    class Id:
        def __init__(self, v: int) -> None:
            self.v = v

        def __index__(self) -> int:
            return self.v

    assert backend.block_keys(2, None, [Id(1), Id(2), 3]) == ref.block_keys(2, None, [1, 2, 3])
    assert outcome(lambda: backend.block_keys(2, None, [Id(-1)])) == outcome(lambda: ref.block_keys(2, None, [Id(-1)]))


def forged(lora_id: Any, salt: Any) -> ReuseScope:
    """A ``ReuseScope`` whose fields skipped ``__post_init__``: backends check them again at use."""
    scope = object.__new__(ReuseScope)
    object.__setattr__(scope, "lora_id", lora_id)
    object.__setattr__(scope, "salt", salt)
    return scope


BAD_OTHER: list[tuple[str, Any]] = [
    ("v2 key short", lambda b: b.block_hash_v2_sha256(b"abc")),
    ("v2 key str", lambda b: b.block_hash_v2_sha256("ab" * 32)),
    ("v2_64 key long", lambda b: b.block_hash_v2_sha256_64(bytes(33))),
    ("v1 digest token", lambda b: b.block_hash_v1([1, bytes(32)], 0)),
    ("v1 negative parent", lambda b: b.block_hash_v1([1], -1)),
    ("v1 parent 2**64", lambda b: b.block_hash_v1([1], 2**64)),
    ("v1 bad scope", lambda b: b.block_hash_v1([1], 0, "s")),
    ("salt bytes", lambda b: b.cache_salt_to_id(b"abc")),
    ("mm digest short", lambda b: b.gen_multimodal_cache_key_tokens(10, b"x", 2)),
    ("mm digest str", lambda b: b.gen_multimodal_cache_key_tokens(10, "x" * 32, 2)),
    ("mm num_tokens 0", lambda b: b.gen_multimodal_cache_key_tokens(10, bytes(32), 0)),
    ("mm offset negative", lambda b: b.gen_multimodal_cache_key_tokens(10, bytes(32), 2, -1)),
    ("mm id_offset negative", lambda b: b.gen_multimodal_cache_key_tokens(-10, bytes(32), 2)),
    ("scope bytes bad", lambda b: b.reuse_scope_to_bytes(3)),
    # block_hash_v1 reads its tokens as the key functions do: no str, no bytes of ids.
    ("v1 bytes tokens", lambda b: b.block_hash_v1(b"x" * 31, 2)),
    ("v1 str tokens", lambda b: b.block_hash_v1("123", 0)),
    ("v1 int tokens", lambda b: b.block_hash_v1(5, 0)),
    ("v1 dict tokens", lambda b: b.block_hash_v1({1: 2}, 0)),
    ("v1 int16 buffer", lambda b: b.block_hash_v1(array("h", [1]), 0)),
    # None for a plain parameter: the same check as any other wrong type.
    ("v1 None tokens", lambda b: b.block_hash_v1(None, 0)),
    ("v1 None parent", lambda b: b.block_hash_v1([1], None)),
    ("tpb None", lambda b: b.block_keys(None, None, [1])),
    ("format None", lambda b: b.block_keys(4, None, [1], None)),
    ("chain tpb None", lambda b: b.sequence_to_blockchain_keys(None, None, [1])),
    ("v2 key None", lambda b: b.block_hash_v2_sha256(None)),
    ("v2_64 key None", lambda b: b.block_hash_v2_sha256_64(None)),
    ("salt None", lambda b: b.cache_salt_to_id(None)),
    ("mm id_offset None", lambda b: b.gen_multimodal_cache_key_tokens(None, bytes(32), 2)),
    ("mm num_tokens None", lambda b: b.gen_multimodal_cache_key_tokens(10, bytes(32), None)),
    # A scope whose fields skipped validation is checked again (ReuseScope's own messages).
    ("forged scope negative lora", lambda b: b.reuse_scope_to_bytes(forged(-1, 0))),
    ("forged scope float salt", lambda b: b.block_keys(4, forged(None, 1.5), [1])),
    ("forged scope str lora", lambda b: b.sequence_to_blockchain_keys(4, forged("1", None), [1])),
    ("forged scope bool salt", lambda b: b.block_hash_v1([1], 0, forged(None, True))),
    ("forged scope lora 2**64", lambda b: b.block_hash_v1([1], 0, forged(2**64, None))),
]


@pytest.mark.parametrize("call", [c[1] for c in BAD_OTHER], ids=[c[0] for c in BAD_OTHER])
def test_bad_input_to_helpers(backend: kv_api.Backend, call: Any) -> None:
    expected = outcome(lambda: call(ref))
    assert expected is not None
    assert outcome(lambda: call(backend)) == expected


def test_v1_tokens_read_as_the_key_functions_read_them(backend: kv_api.Backend) -> None:
    expected = ref.block_hash_v1([1, 2, 3], 7)
    for tokens in ([1, 2, 3], (1, 2, 3), iter([1, 2, 3]), array("I", [1, 2, 3]), np.array([1, 2, 3], np.uint64)):
        assert backend.block_hash_v1(tokens, 7) == expected, tokens


def test_a_forged_scope_with_valid_fields_reads_as_built(backend: kv_api.Backend) -> None:
    # The fields are converted as ReuseScope's own checks convert them (numpy ints included).
    scope = forged(np.uint64(3), None)
    assert backend.reuse_scope_to_bytes(scope) == ref.reuse_scope_to_bytes(ReuseScope(3))
    assert backend.block_keys(4, scope, [1, 2, 3, 4]) == ref.block_keys(4, ReuseScope(3), [1, 2, 3, 4])
    assert backend.block_hash_v1([1], 0, forged(None, np.int64(9))) == ref.block_hash_v1([1], 0, ReuseScope(None, 9))


@pytest.mark.parametrize("tokens_per_block", [2**63, 2**64 - 1, 2**64, 10**30])
def test_a_block_wider_than_any_prompt_is_one_partial_block(backend: kv_api.Backend, tokens_per_block: int) -> None:
    """A fuzzer finding: the native block count rounded up as ``(n + tpb - 1) / tpb``, which
    wrapped for a ``tokens_per_block`` near 2**64, so the partial block's key went missing."""
    tokens = [1, 2, 3, 4, 5, 6]
    keys = backend.block_keys(tokens_per_block, ReuseScope(1, None), tokens)
    assert keys == ref.block_keys(tokens_per_block, ReuseScope(1, None), tokens)
    assert len(keys) == 64
    assert [len(chunk) for chunk, _ in backend.sequence_to_blockchain_keys(tokens_per_block, None, tokens)] == [0, 6]


@pytest.mark.parametrize("high", [0x01010101, 0x7F000000, 1])
def test_u32_keys_refuse_wide_int64_buffers(backend: kv_api.Backend, high: int) -> None:
    """An int64 buffer whose items have their high half set (in every byte, or only one) is out of
    range for ``sha256-u32``, as the same values in a list are: never truncated to 32 bits."""
    values = [(high << 32) | 5] * (2 * TPB)
    with pytest.raises(ValueError):
        kv_api.keys.block_keys(TPB, None, values, SHA256_U32)
    with pytest.raises(ValueError):
        backend.block_keys(TPB, None, np.array(values, dtype=np.int64), SHA256_U32)
    with pytest.raises(ValueError):
        backend.block_keys(TPB, None, values, SHA256_U32)


@pytest.mark.parametrize("value", [-1, -5, -(2**56), -(2**63)])
@pytest.mark.parametrize("key_format", ["sha256-u32", "sha256-u64"])
def test_negative_ids_in_signed_buffers_are_refused(backend: kv_api.Backend, value: int, key_format: str) -> None:
    """Negative ids in an int64 buffer are out of range, whichever of their bytes is set."""
    values = [value, 1, 2, 3] * 2
    with pytest.raises(ValueError):
        kv_api.keys.block_keys(TPB, None, values, key_format)
    with pytest.raises(ValueError):
        backend.block_keys(TPB, None, np.array(values, dtype=np.int64), key_format)
