"""Random inputs: every backend's keys equal the reference ``kv_api.keys`` for every container."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kv_api
from kv_api import MmItemContext, ReuseScope
from kv_api import keys as ref
from kv_api.contract import BACKEND_ATTRIBUTES

from ._tokens import INT_CONTAINERS

u64 = st.integers(0, 2**64 - 1)
scopes = st.builds(ReuseScope, st.none() | u64, st.none() | u64)
digests = st.binary(min_size=32, max_size=32)
formats = st.sampled_from(kv_api.KEY_FORMATS)


def test_key_functions_are_the_backends_own(backend: kv_api.Backend) -> None:
    """A backend exporting ``kv_api.keys``' functions would make every test here compare the
    reference with itself."""
    borrowed = [n for n in BACKEND_ATTRIBUTES if getattr(backend, n) is getattr(ref, n, None)]
    assert not borrowed, f"re-exported from kv_api.keys: {', '.join(borrowed)}"


@given(
    tpb=st.integers(1, 70),
    scope=scopes,
    key_format=formats,
    ids=st.lists(st.integers(0, 2**31 - 1), max_size=300),
    container=st.sampled_from(sorted(INT_CONTAINERS)),
)
def test_int_tokens_match_reference(
    backend: kv_api.Backend, tpb: int, scope: ReuseScope, key_format: str, ids: list[int], container: str
) -> None:
    expected = ref.block_keys(tpb, scope, ids, key_format)
    assert backend.block_keys(tpb, scope, INT_CONTAINERS[container](ids), key_format) == expected
    pairs = list(backend.sequence_to_blockchain_keys(tpb, scope, INT_CONTAINERS[container](ids), key_format))
    assert pairs == list(ref.sequence_to_blockchain_keys(tpb, scope, ids, key_format))
    assert b"".join(k for _, k in pairs) == expected


@given(
    tpb=st.integers(1, 9),
    scope=scopes,
    key_format=formats,
    tokens=st.lists(
        st.integers(0, 2**31 - 1) | digests | st.builds(MmItemContext, digests, st.none() | st.text(max_size=4)),
        max_size=40,
    ),
    as_tuple=st.booleans(),
)
def test_digest_tokens_match_reference(
    backend: kv_api.Backend, tpb: int, scope: ReuseScope, key_format: str, tokens: list[Any], as_tuple: bool
) -> None:
    given_tokens = tuple(tokens) if as_tuple else iter(tokens)
    assert backend.block_keys(tpb, scope, given_tokens, key_format) == ref.block_keys(tpb, scope, tokens, key_format)


@given(ids=st.lists(st.integers(0, 2**64 - 1), max_size=100), tpb=st.integers(1, 40))
def test_u64_ids_match_reference(backend: kv_api.Backend, ids: list[int], tpb: int) -> None:
    expected = ref.block_keys(tpb, None, ids, "sha256-u64")
    assert backend.block_keys(tpb, None, ids, "sha256-u64") == expected
    assert backend.block_keys(tpb, None, np.asarray(ids, dtype=np.uint64), "sha256-u64") == expected


@pytest.mark.parametrize("key_format", kv_api.KEY_FORMATS)
@pytest.mark.parametrize("tpb", [1, 37, 1023, 1024, 1025, 5000])
def test_runs_crossing_4kb_and_digests_everywhere(backend: kv_api.Backend, key_format: str, tpb: int) -> None:
    """Zero-copy, packed and per-token paths agree: odd lengths, runs over 4 KB, digests anywhere."""
    ids = [(i * 2654435761) % 2**31 for i in range(5003)]
    expected = ref.block_keys(tpb, None, ids, key_format)
    for container in ("list", "array_i", "array_q", "numpy_int32_strided", "generator"):
        assert backend.block_keys(tpb, None, INT_CONTAINERS[container](ids), key_format) == expected, container
    digest = bytes(range(32))
    for position in (0, 1, 1023, 1024, 1025, 2047, 4096, 5002):
        mixed: list[Any] = list(ids)
        mixed[position] = digest
        assert backend.block_keys(tpb, None, mixed, key_format) == ref.block_keys(tpb, None, mixed, key_format), (
            position
        )


def test_sequence_keys_are_lazy_but_validated_now(backend: kv_api.Backend) -> None:
    consumed = []

    def tokens() -> Any:
        for t in range(10):
            consumed.append(t)
            yield t

    it = backend.sequence_to_blockchain_keys(4, None, tokens())
    assert consumed == list(range(10))  # read at the call
    assert next(it)[0] == [] and next(it)[0] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="token 1"):
        backend.sequence_to_blockchain_keys(4, None, [0, -1])


def test_iterator_outlives_its_buffer(backend: kv_api.Backend) -> None:
    buf = np.arange(100, dtype=np.int32)
    it = backend.sequence_to_blockchain_keys(8, None, buf)
    expected = list(ref.sequence_to_blockchain_keys(8, None, list(range(100))))
    buf[:] = 7  # later changes to the caller's buffer do not change the keys
    del buf
    assert list(it) == expected


def test_block_hash_v1_with_wide_scope_ids(backend: kv_api.Backend) -> None:
    """Salts and LoRA ids beyond 32 bits go through every shift of the 64-bit mix; checked
    against kv_api's reference."""
    rng = random.Random(10)
    for _ in range(50):
        scope = ReuseScope(rng.choice([None, rng.getrandbits(64)]), rng.choice([None, rng.getrandbits(64)]))
        tokens = [rng.getrandbits(rng.choice([8, 31])) for _ in range(rng.randint(1, 9))]
        parent = rng.choice([0, rng.getrandbits(64)])
        assert backend.block_hash_v1(tokens, parent, scope) == kv_api.keys.block_hash_v1(tokens, parent, scope)
    salt = "a salt whose id is wide"
    assert backend.cache_salt_to_id(salt) == kv_api.keys.cache_salt_to_id(salt) >= 1 << 32
