"""Synthetic token ids: the vectorised runs against a token-at-a-time reference in Python ints; the
populated arrays they are written to."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_replay import populated as populated_module
from kv_replay import synthetic
from kv_replay.populated import populated
from kv_replay.synthetic import synthetic_runs, synthetic_tokens

MASK = 2**64 - 1


def _mix(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def reference(seed: int, n: int, stream: int) -> list[int]:
    start = _mix((stream * 0x9E3779B97F4A7C15 + seed) & MASK)
    return [_mix((start + i) & MASK) % (1 << 17) for i in range(n)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, MASK), st.integers(0, 40)), max_size=12),
    st.integers(0, 2**20),
    st.sampled_from([1, 3, 16, 1 << 16]),
)
def test_runs_are_the_reference_tokens(runs: list[tuple[int, int]], stream: int, chunk: int) -> None:
    # A small chunk makes runs span chunks and chunks hold several runs.
    original = synthetic.CHUNK
    synthetic.CHUNK = chunk
    try:
        seeds = np.array([s for s, _ in runs], dtype=np.uint64)
        lengths = np.array([n for _, n in runs], dtype=np.int64)
        got = synthetic_runs(seeds, lengths, stream)
    finally:
        synthetic.CHUNK = original
    assert got.dtype == np.int32
    assert got.tolist() == [t for s, n in runs for t in reference(s, n, stream)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, MASK), max_size=12),
    st.integers(1, 40),
    st.integers(0, 2**20),
    st.sampled_from([40, 64, 100, 1 << 16]),
)
def test_equal_runs_are_the_reference_tokens(seeds: list[int], width: int, stream: int, chunk: int) -> None:
    # Runs of one length (a Mooncake table's) take a path of their own: a chunk of whole runs.
    original = synthetic.CHUNK
    synthetic.CHUNK = chunk
    try:
        got = synthetic_runs(np.array(seeds, dtype=np.uint64), np.full(len(seeds), width, dtype=np.int64), stream)
    finally:
        synthetic.CHUNK = original
    assert got.dtype == np.int32
    assert got.tolist() == [t for s in seeds for t in reference(s, width, stream)]


def test_a_long_run_crosses_chunks() -> None:
    n = synthetic.CHUNK * 2 + 5
    tokens = synthetic_tokens(7, n, stream=2)
    assert len(tokens) == n
    for i in (0, synthetic.CHUNK - 1, synthetic.CHUNK, n - 1):
        assert int(tokens[i]) == reference(7, i + 1, 2)[i]


def test_populated_arrays_are_writable_and_sized() -> None:
    for n in (0, 5, populated_module.SMALL, populated_module.SMALL + 3):
        a = populated(n, np.int32)
        assert a.dtype == np.int32 and a.shape == (n,) and a.flags.writeable
        a[:] = 7
        assert (a == 7).all()
