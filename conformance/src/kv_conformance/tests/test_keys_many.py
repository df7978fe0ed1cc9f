"""``block_keys_many`` (docs/key-format.md, "Many chains"): exactly ``block_keys`` per input on
every backend and SHA-256 transform (the native backend hashes chains two at a time), and bad
input refused alike, naming the input, before any hashing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kv_api
from kv_api import MmItemContext, ReuseScope
from kv_api import keys as ref

from ._tokens import INT_CONTAINERS
from .test_keys_golden import transforms

u64 = st.integers(0, 2**64 - 1)
scopes = st.none() | st.builds(ReuseScope, st.none() | u64, st.none() | u64)
digests = st.binary(min_size=32, max_size=32)
containers = st.sampled_from(sorted(INT_CONTAINERS))


@given(
    tpb=st.integers(1, 40),
    key_format=st.sampled_from(kv_api.KEY_FORMATS),
    chains=st.lists(st.tuples(scopes, st.lists(st.integers(0, 2**31 - 1), max_size=300), containers), max_size=7),
    one_scope=st.booleans(),
    as_tuple=st.booleans(),
)
def test_random_int_chains_equal_block_keys(
    backend: kv_api.Backend,
    tpb: int,
    key_format: str,
    chains: list[tuple[ReuseScope | None, list[int], str]],
    one_scope: bool,
    as_tuple: bool,
) -> None:
    inputs = [INT_CONTAINERS[c](ids) for _, ids, c in chains]
    scope_list = None if one_scope else [s for s, _, _ in chains]
    got = backend.block_keys_many(
        tpb,
        tuple(scope_list) if as_tuple and scope_list is not None else scope_list,
        tuple(inputs) if as_tuple else inputs,
        key_format,
    )
    want = [ref.block_keys(tpb, None if one_scope else s, ids, key_format) for s, ids, _ in chains]
    assert got == want
    # And each equals the backend's own block_keys (generators were consumed: rebuild them).
    assert got == [
        backend.block_keys(tpb, None if one_scope else s, INT_CONTAINERS[c](ids), key_format) for s, ids, c in chains
    ]


@given(
    tpb=st.integers(1, 9),
    chains=st.lists(
        st.lists(
            st.integers(0, 2**31 - 1) | digests | st.builds(MmItemContext, digests, st.none() | st.text(max_size=4)),
            max_size=40,
        ),
        max_size=5,
    ),
)
def test_chains_with_digest_tokens_equal_block_keys(backend: kv_api.Backend, tpb: int, chains: list[list[Any]]) -> None:
    """A digest token stops a chain's paired run; the rest goes on one chain at a time."""
    got = backend.block_keys_many(tpb, None, chains)
    assert got == [ref.block_keys(tpb, None, t) for t in chains]


# Unequal lengths in one call, so that a chain ending hands its slot to the next one while its
# partner goes on; tpb 32 u32 is three compressions a key, tpb 1 and 13 put the whole message
# in one block or spill the padding, tpb 16 u64 is exactly two blocks.
LENGTHS = [4096, 100, 2999, 0, 33, 4096 * 2 + 7, 64, 1, 500, 4096]


@pytest.mark.parametrize(
    ("tpb", "key_format"), [(32, "sha256-u32"), (1, "sha256-u32"), (13, "sha256-u64"), (16, "sha256-u64")]
)
def test_every_transform_every_pairing(backend: kv_api.Backend, tpb: int, key_format: str) -> None:
    rng = np.random.default_rng(tpb)
    ids = [rng.integers(0, 2**31, n, dtype=np.int64) for n in LENGTHS]
    dtype = np.int32 if key_format == "sha256-u32" else np.int64
    inputs: list[Any] = [a.astype(dtype) for a in ids]
    inputs[2] = inputs[2].tolist()  # a list (packed by the backend)
    inputs[4] = ids[4].astype(np.int64 if dtype is np.int32 else np.int32)  # width mismatch: packed
    inputs[6] = np.repeat(inputs[6], 2)[::2]  # strided: packed
    scope_list = [ReuseScope(i, None if i % 2 else i * 7) for i in range(len(inputs))]
    want = [ref.block_keys(tpb, s, a.tolist(), key_format) for s, a in zip(scope_list, ids, strict=True)]
    for transform in transforms(backend):
        got = backend.block_keys_many(tpb, scope_list, inputs, key_format)
        assert got == want, transform
        # Odd counts leave one chain without a partner.
        assert backend.block_keys_many(tpb, scope_list[:3], inputs[:3], key_format) == want[:3], transform


def test_long_inputs_needing_packing(backend: kv_api.Backend) -> None:
    """int64 inputs under ``sha256-u32`` long enough that a backend packing them for paired
    hashing must stop partway (kv_core_cpp packs up to 1 MiB a chain, 8,192 blocks here) and go
    on per chain: the keys are block_keys' all the same."""
    rng = np.random.default_rng(5)
    inputs = [rng.integers(0, 2**31, n, dtype=np.int64) for n in (300_001, 262_144, 40_000)]
    want = [backend.block_keys(32, None, a.astype(np.int32)) for a in inputs]
    assert backend.block_keys_many(32, None, inputs) == want


@pytest.mark.parametrize("reuse_scopes", [None, [], ()])
@pytest.mark.parametrize("token_inputs", [[], ()])
def test_no_inputs(backend: kv_api.Backend, reuse_scopes: Any, token_inputs: Any) -> None:
    assert backend.block_keys_many(32, reuse_scopes, token_inputs) == []


def test_one_input_is_block_keys(backend: kv_api.Backend) -> None:
    tokens = list(range(100))
    assert backend.block_keys_many(8, [ReuseScope(3, 4)], [tokens]) == [backend.block_keys(8, ReuseScope(3, 4), tokens)]


class _Boom:
    def __index__(self) -> int:
        raise RuntimeError("boom")


# (label, args, class, message): the first bad argument in the documented order is reported,
# and an input's own error is prefixed with its place in the list.
BAD: list[tuple[str, tuple[Any, ...], type[Exception], str]] = [
    ("tpb 0 before bad scopes", (0, 5, 5), ValueError, "tokens_per_block: must be >= 1 (got 0)"),
    (
        "scopes not a list",
        (4, ReuseScope(), [[1]]),
        TypeError,
        "reuse_scopes: expected a list or tuple of ReuseScope or None, got ReuseScope",
    ),
    (
        "a bad scope item, named",
        (4, [None, ReuseScope(), 7], [[1], [2], [3]]),
        TypeError,
        "reuse_scopes[2]: reuse_scope: expected ReuseScope or None, got int",
    ),
    (
        "scope before key_format",
        (4, [1], [[1]], "nope"),
        TypeError,
        "reuse_scopes[0]: reuse_scope: expected ReuseScope or None, got int",
    ),
    (
        "key_format before inputs",
        (4, None, "x", "nope"),
        ValueError,
        "key_format: unknown 'nope' (expected one of sha256-u32, sha256-u64)",
    ),
    (
        "inputs not a list",
        (4, None, np.zeros(3, dtype=np.int32)),
        TypeError,
        "token_inputs: expected a list or tuple of token inputs, got ndarray",
    ),
    (
        "inputs a generator",
        (4, None, ([1] for _ in range(2))),
        TypeError,
        "token_inputs: expected a list or tuple of token inputs, got generator",
    ),
    ("length mismatch", (4, [None, None], [[1]]), ValueError, "token_inputs: 1 inputs for 2 reuse scopes"),
    (
        "bad id in input 1",
        (4, None, [[1, 2], [3, -1]]),
        ValueError,
        "token_inputs[1]: token 1: id -1 out of range for sha256-u32 (0 <= id < 2**31)",
    ),
    ("bool token in input 0", (4, None, [[True], [-1]]), TypeError, "token_inputs[0]: token 0: bool is not a token id"),
    (
        "bad buffer in input 2",
        (4, None, [[1], np.zeros(2, dtype=np.int32), np.zeros(2, dtype=np.float32)]),
        TypeError,
        "token_inputs[2]: tokens: a token buffer must hold 4- or 8-byte integers in native byte order "
        "(got format 'f', itemsize 4)",
    ),
    (
        "str input",
        (4, None, [[1], "12"]),
        TypeError,
        "token_inputs[1]: tokens: expected a buffer or an iterable of tokens, got str",
    ),
    (
        "short digest",
        (4, None, [[b"x" * 31]]),
        ValueError,
        "token_inputs[0]: token 0: a digest token must be 32 bytes (got 31)",
    ),
]


@pytest.mark.parametrize(("label", "args", "cls", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_same_error_everywhere(
    backends: list[kv_api.Backend], label: str, args: tuple[Any, ...], cls: type[Exception], message: str
) -> None:
    for b in backends:
        with pytest.raises(cls) as info:
            b.block_keys_many(*args)
        assert type(info.value) is cls, (b.name, label)
        assert str(info.value) == message, (b.name, label)
    with pytest.raises(cls) as info:
        ref.block_keys_many(*args)
    assert str(info.value) == message, ("kv_api.keys", label)


def test_other_exceptions_pass_through_unnamed(backends: list[kv_api.Backend]) -> None:
    """Only the key functions' own TypeError / ValueError get the prefix; an id's ``__index__``
    raising something else reaches the caller as it was raised."""
    for b in backends:
        with pytest.raises(RuntimeError, match=r"^boom$"):
            b.block_keys_many(4, None, [[1], [_Boom()]])


def test_prefixed_error_chains_the_original(backends: list[kv_api.Backend]) -> None:
    for b in backends:
        with pytest.raises(ValueError) as info:
            b.block_keys_many(4, None, [[1], [-1]])
        cause = info.value.__cause__
        assert (
            type(cause) is ValueError and str(cause) == "token 0: id -1 out of range for sha256-u32 (0 <= id < 2**31)"
        )
        # The same error block_keys raises for that input alone.
        with pytest.raises(ValueError, match=r"^token 0: id -1 out of range"):
            b.block_keys(4, None, [-1])


def test_equal_prefixes_equal_keys_across_inputs(backend: kv_api.Backend) -> None:
    """Two chains over one buffer (a view of it, then the whole), hashed as a pair: the shared
    prefix gives the same keys, the rest differs."""
    a = np.arange(64, dtype=np.int32)
    short, full = backend.block_keys_many(8, None, [a[:40], a])
    assert len(short) == 32 * 6 and len(full) == 32 * 9
    assert full[: 32 * 6] == short
    assert len({full[i : i + 32] for i in range(0, len(full), 32)}) == 9
