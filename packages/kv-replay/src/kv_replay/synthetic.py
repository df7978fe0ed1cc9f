"""Deterministic synthetic token ids: equal ``(stream, seed)``, equal tokens, whatever the batch.

A run's ``i``-th token is splitmix64's finaliser of ``start + i`` modulo the vocabulary, where
``start`` is the finaliser of ``stream * golden + seed``. ``synthetic_runs`` makes many runs in
one vectorised pass, in cache-sized chunks, with the same tokens ``synthetic_tokens`` makes one
run at a time: a trace's expansion costs a few numpy calls per 64 Ki tokens, not per request.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kv_replay.populated import populated

VOCAB = 1 << 17
GOLDEN = 0x9E3779B97F4A7C15
_MIXERS = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB))
#: Tokens mixed at a time: four 512 KiB temporaries, well inside the caches.
CHUNK = 1 << 16

U64 = np.ndarray[Any, np.dtype[np.uint64]]
I32 = np.ndarray[Any, np.dtype[np.int32]]


def _mix(x: U64, scratch: U64 | None = None) -> U64:
    """A 64-bit mixer (splitmix64's finaliser), vectorised, in place: distinct inputs, unrelated
    outputs."""
    shifted = np.empty_like(x) if scratch is None else scratch
    with np.errstate(over="ignore"):
        for shift, multiplier in _MIXERS:
            np.right_shift(x, np.uint64(shift), out=shifted)
            np.bitwise_xor(x, shifted, out=x)
            np.multiply(x, np.uint64(multiplier), out=x)
        np.right_shift(x, np.uint64(31), out=shifted)
        np.bitwise_xor(x, shifted, out=x)
    return x


def synthetic_tokens(seed: int, n: int, stream: int = 0) -> I32:
    """``n`` deterministic token ids for ``(stream, seed)``."""
    return synthetic_runs(np.array([seed % 2**64], dtype=np.uint64), np.array([n], dtype=np.int64), stream)


def synthetic_runs(seeds: U64, lengths: np.ndarray[Any, np.dtype[np.int64]], stream: int = 0) -> I32:
    """The runs ``synthetic_tokens(seeds[i], lengths[i], stream)``, concatenated."""
    kept = lengths > 0
    seeds, lengths = seeds[kept], lengths[kept].astype(np.int64)
    ends = np.cumsum(lengths)
    offsets = ends - lengths
    out = populated(int(ends[-1]) if len(ends) else 0, np.int32)
    with np.errstate(over="ignore"):
        starts = _mix(seeds + np.uint64(stream * GOLDEN % 2**64))  # wraps modulo 2**64
    # Scratch reused by every chunk: fresh large arrays would fault their pages in each time.
    steps = np.arange(CHUNK, dtype=np.uint64)
    counters, scratch = np.empty(CHUNK, dtype=np.uint64), np.empty(CHUNK, dtype=np.uint64)
    width = int(lengths[0]) if len(lengths) else 0
    if 0 < width <= CHUNK and bool((lengths == width).all()):
        _equal_runs(starts, width, steps, counters, scratch, out)
        return out
    with np.errstate(over="ignore"):
        # The counter at output position p of run r is starts[r] + (p - offsets[r]): one base per run.
        bases = starts - offsets.astype(np.uint64)
    r = 0
    while r < len(lengths):
        # Runs r..s-1 fill at most a chunk, or run r alone is cut into chunks.
        s = max(r + 1, int(np.searchsorted(ends, offsets[r] + CHUNK, side="right")))
        a, b = int(offsets[r]), int(ends[s - 1])
        for c in range(a, b, CHUNK):
            n = min(CHUNK, b - c)
            x, spare = counters[:n], scratch[:n]
            with np.errstate(over="ignore"):
                if s == r + 1:
                    np.add(steps[:n], bases[r] + np.uint64(c), out=x)
                else:  # each run's base from where it starts, by a running sum of differences
                    x.fill(0)
                    x[offsets[r:s] - a] = np.diff(bases[r:s], prepend=np.uint64(0))
                    np.cumsum(x, out=x)
                    np.add(x, steps[:n], out=x)
                    np.add(x, np.uint64(c), out=x)
                _mix(x, spare)
            np.bitwise_and(x, np.uint64(VOCAB - 1), out=x)  # VOCAB is a power of two: the modulo
            out[c : c + n] = x
        r = s
    return out


def _equal_runs(starts: U64, width: int, steps: U64, counters: U64, scratch: U64, out: I32) -> None:
    """``synthetic_runs`` where every run has ``width`` tokens (a Mooncake trace's table of 512-token
    blocks): a chunk's counters are a broadcast sum, each run's start plus 0..width-1, where
    runs of any lengths take a running sum over the chunk (four passes more, one of them a cumsum:
    the table took 7 ns a token)."""
    per = len(counters) // width  # runs a chunk holds
    for r in range(0, len(starts), per):
        k = min(per, len(starts) - r)
        x, spare = counters[: k * width], scratch[: k * width]
        with np.errstate(over="ignore"):
            np.add(starts[r : r + k, None], steps[None, :width], out=x.reshape(k, width))
            _mix(x, spare)
        np.bitwise_and(x, np.uint64(VOCAB - 1), out=x)
        out[r * width : (r + k) * width] = x
