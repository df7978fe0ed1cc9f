"""Lists of ints, the fast readers (issue 14, item 3): long runs of plain ints are read without
the general rules, and the item that ends a run (a bool, an int-like, a digest, an id out of
range, one that changes the list) is decided by the general rules as if every item had been.
Every backend agrees with kv_api.keys, the reference, on values and on error class and message,
wherever in a long list that item sits and whichever digit count the ids have."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_api import keys as ref

# Long enough for runs, prefetch distances, several blocks either side, and several of the Python
# backend's 8,192-token segments (kv_core_py.block_keys.SEGMENT_TOKENS).
N = 20_000


class IntLike:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class Grow:
    """``__index__`` appends plain ints (some of them out of range when ``bad``) to its list."""

    def __init__(self, tokens: list[Any], n: int, bad: bool = False) -> None:
        self.tokens, self.n, self.bad = tokens, n, bad

    def __index__(self) -> int:
        self.tokens.extend(range(2**30 - 3, 2**30 - 3 + self.n))
        if self.bad:
            self.tokens.append(-1)
        return 7


class Shrink:
    """``__index__`` drops the list's tail from just after itself."""

    def __init__(self, tokens: list[Any], keep: int) -> None:
        self.tokens, self.keep = tokens, keep

    def __index__(self) -> int:
        del self.tokens[self.keep :]
        return 8


def ids(seed: int = 0, high: int = 2**31) -> list[int]:
    """Ids below ``high``, both sides of 2**30 (one and two 30-bit digits), 0 included."""
    out = [int(v) for v in np.random.default_rng(seed).integers(0, high, N)]
    out[1] = 0
    out[2] = 2**30
    out[3] = 2**30 - 1
    return out


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("value", call())
    except Exception as exc:  # noqa: BLE001 - class and message are what the backends must agree on
        return ("raised", type(exc), str(exc))


POSITIONS = [0, 1, 31, 32, 33, 1000, 8191, 8192, 16_500, N - 1]

ODD: dict[str, Callable[[], Any]] = {
    "bool": lambda: True,
    "int-like": lambda: IntLike(12345),
    "int-like out of range": lambda: IntLike(2**31),
    "negative": lambda: -1,
    "u32 limit": lambda: 2**31,
    "two digits": lambda: 2**31 - 1,
    "three digits": lambda: 2**61,
    "u64 max": lambda: 2**64 - 1,
    "beyond 64 bits": lambda: 2**64,
    "huge": lambda: 10**40,
    "digest": lambda: bytes(range(32)),
    "short digest": lambda: b"abc",
    "float": lambda: 1.0,
    "None": lambda: None,
}


@pytest.mark.parametrize("key_format", ["sha256-u32", "sha256-u64"])
@pytest.mark.parametrize("odd", sorted(ODD))
@pytest.mark.parametrize("position", POSITIONS)
def test_an_odd_item_anywhere_in_a_long_list(backend: kv_api.Backend, odd: str, position: int, key_format: str) -> None:
    def tokens() -> list[Any]:
        out: list[Any] = ids(position)
        out[position] = ODD[odd]()
        return out

    expected = outcome(lambda: ref.block_keys(32, None, tokens(), key_format))
    assert outcome(lambda: backend.block_keys(32, None, tokens(), key_format)) == expected
    assert outcome(lambda: backend.block_keys(32, None, tuple(tokens()), key_format)) == expected
    pairs = outcome(lambda: list(backend.sequence_to_blockchain_keys(32, None, tokens(), key_format)))
    assert pairs == outcome(lambda: list(ref.sequence_to_blockchain_keys(32, None, tokens(), key_format)))


@pytest.mark.parametrize("key_format", ["sha256-u32", "sha256-u64"])
@pytest.mark.parametrize("high", [2**8, 2**30, 2**31])
@pytest.mark.parametrize("tpb", [1, 7, 32, 64])
def test_plain_lists_match_the_reference_and_buffers(
    backend: kv_api.Backend, high: int, tpb: int, key_format: str
) -> None:
    tokens = ids(tpb, high)
    expected = ref.block_keys(tpb, None, tokens, key_format)
    assert backend.block_keys(tpb, None, tokens, key_format) == expected
    assert backend.block_keys(tpb, None, np.asarray(tokens, dtype=np.int64), key_format) == expected
    pairs = list(backend.sequence_to_blockchain_keys(tpb, None, tokens, key_format))
    assert pairs == list(ref.sequence_to_blockchain_keys(tpb, None, tokens, key_format))
    assert list(backend.sequence_to_blockchain_keys(tpb, None, tuple(tokens), key_format)) == pairs
    assert all(type(block) is list and all(type(t) is int for t in block) for block, _ in pairs)


@pytest.mark.parametrize("position", [0, 40, 8192, N - 1])
@pytest.mark.parametrize("change", ["grow", "grow-bad", "shrink-here", "shrink-after", "clear"])
def test_a_list_changed_by_an_item_in_a_long_run(backend: kv_api.Backend, change: str, position: int) -> None:
    """The fast read resumes after the item that ran Python code, on the list as it is then."""

    def tokens() -> list[Any]:
        out: list[Any] = ids(position)
        makers: dict[str, Callable[[], object]] = {
            "grow": lambda: Grow(out, 3000),
            "grow-bad": lambda: Grow(out, 3000, bad=True),
            "shrink-here": lambda: Shrink(out, position + 1),
            "shrink-after": lambda: Shrink(out, position + 37),
            "clear": lambda: Shrink(out, 0),
        }
        out[position] = makers[change]()
        return out

    expected = outcome(lambda: ref.block_keys(32, None, tokens()))
    assert outcome(lambda: backend.block_keys(32, None, tokens())) == expected
    pairs = outcome(lambda: list(backend.sequence_to_blockchain_keys(32, None, tokens())))
    assert pairs == outcome(lambda: list(ref.sequence_to_blockchain_keys(32, None, tokens())))


def test_the_kept_copy_is_the_list_as_it_was_when_called(backend: kv_api.Backend) -> None:
    """Block lists come from a copy taken at the call: changing the caller's list afterwards
    changes neither the keys nor the blocks still to come."""
    tokens = ids(3)
    expected = list(ref.sequence_to_blockchain_keys(32, None, list(tokens)))
    it = iter(backend.sequence_to_blockchain_keys(32, None, tokens))
    first = [next(it), next(it)]
    tokens[:] = [1] * len(tokens)
    assert first + list(it) == expected


@pytest.mark.parametrize("nth", [0, 1, 2, 4, 8, 16])
@pytest.mark.parametrize("change", ["shrink", "grow"])
def test_a_list_changed_by_the_collector_during_the_call(backend: kv_api.Backend, change: str, nth: int) -> None:
    """Allocations during the call may run the garbage collector, and its callbacks Python code
    that changes the list's length: what comes out is the list before or after, never a mix,
    and every key is the key of the blocks it comes with."""
    tokens = ids(4)
    before = list(tokens)
    after = before[:12_000] if change == "shrink" else before + list(range(100))
    seen = [0]

    def change_list(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen[0] += 1
            if seen[0] == nth + 1:
                tokens[:] = after

    threshold = gc.get_threshold()
    gc.callbacks.append(change_list)
    gc.set_threshold(1)
    try:
        pairs = list(backend.sequence_to_blockchain_keys(32, None, tokens))
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(change_list)
    read = [t for block, _ in pairs for t in block]
    assert read in (before, after)
    assert pairs == list(ref.sequence_to_blockchain_keys(32, None, read))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 100) | st.integers(8_000, 3 * 8192 + 100),
    seed=st.integers(0, 2**32 - 1),
    tpb=st.integers(1, 100),
    odd=st.none() | st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(ODD))),
    as_tuple=st.booleans(),
    key_format=st.sampled_from(["sha256-u32", "sha256-u64"]),
)
def test_long_lists_match_the_reference(
    backend: kv_api.Backend,
    n: int,
    seed: int,
    tpb: int,
    odd: tuple[int, str] | None,
    as_tuple: bool,
    key_format: str,
) -> None:
    """Any length across the Python backend's segments, any block size, an odd item anywhere or
    none, a list or a tuple: the pairs, or the error, are the reference's."""
    tokens: list[Any] = [int(v) for v in np.random.default_rng(seed).integers(0, 2**31, n)]
    if odd is not None and n:
        tokens[odd[0] % n] = ODD[odd[1]]()
    given_tokens = tuple(tokens) if as_tuple else tokens
    expected = outcome(lambda: list(ref.sequence_to_blockchain_keys(tpb, None, tokens, key_format)))
    assert outcome(lambda: list(backend.sequence_to_blockchain_keys(tpb, None, given_tokens, key_format))) == expected
