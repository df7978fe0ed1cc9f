"""Stack distances of a replay's reused blocks: how many device slots each would have needed to
still be cached, so that one replay estimates the hit rate at every device quota
(``kv_replay.quota_curve``).

The manager evicts the page evictable the longest (one priority): a page joins the eviction
queue when the last cache holding it closes, a cache releasing its blocks last first, and leaves
it when a cache locks it again. A released block ``b`` is therefore still cached at a quota of
``C`` slots exactly while fewer than ``C`` other pages are either in use or released after it
(they all stay cached while it does, and every eviction before ``b``'s took an older page).
That count only grows, so it answers for every ``C`` at once: Mattson's stack algorithm, with
the pages in use at the top of the stack. A block whose prefix was evicted is evicted too (a
child is released before its parent, so it is older), and a block missed at a small quota is
committed again at the same moment a larger quota reuses it, so the order of the queue, and
every distance, is the same at every quota. The recorder runs on the replay at an unbounded
quota (nothing evicted), whose schedule it assumes for every quota: where a small quota makes
the real replay wait or preempt, the estimate is off (docs/replay.md, "Capacity curve").

Blocks are named by a 64-bit hash of their scope and every token up to their end (a random
linear function of the tokens, mixed), computed for a whole prompt at once with numpy; spatial
sampling (SHARDS, Waldspurger et al., FAST '15) keeps the blocks whose name falls below
``rate * 2**64``, so the Python work is ``rate`` times the blocks and distances scale by
``1 / rate``. Partial blocks (a prompt's tail, and the tail a close commits) are not counted as
pages: one per request against the hundreds a prompt's blocks take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kv_api import ReuseScope

_U64 = np.uint64
_Tokens = np.ndarray[Any, np.dtype[np.int32]]
_Keys = np.ndarray[Any, np.dtype[np.uint64]]


def _mix(x: _Keys) -> _Keys:
    """splitmix64's finaliser: every output bit depends on every input bit."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


@dataclass
class _Open:
    """A started request's blocks as the recorder knows them."""

    scope: int  # the scope's share of every block name
    blocks: int  # full blocks named so far
    prefix: int  # the linear hash of every token of those blocks
    tail: _Tokens  # the tokens after them
    sampled: list[int] = field(default_factory=list)  # names of its sampled blocks, in order


class StackRecorder:
    """Told each request's start and close by the replay (``Replayer.recorder``); collects the
    distances of the blocks reused at first starts (``distances``, in sampled pages) and the
    tokens reused beyond the last full block (``partial``: (distance, tokens) per request)."""

    def __init__(self, tokens_per_block: int, rate: float = 1.0, seed: int = 0) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1] (got {rate})")
        self.tokens_per_block = tokens_per_block
        self.rate = rate
        self._threshold = None if rate >= 1.0 else _U64(min(int(rate * 2.0**64), 2**64 - 1))
        self._weights = np.zeros(0, dtype=_U64)
        self._rng = np.random.default_rng(seed)
        self._open: dict[int, _Open] = {}
        self._holders: dict[int, int] = {}  # caches holding each sampled block in use
        self._stamp: dict[int, int] = {}  # each released sampled block's place in the queue
        self._tree = [0]  # Fenwick tree over places, 1-based
        self._clock = 0  # places handed out
        self.in_use = 0  # sampled blocks some cache holds
        self.distances: list[int] = []  # of sampled blocks reused at first starts; -1: unknown
        self.partial: list[tuple[int, int]] = []
        self.reused_full_tokens = 0  # exact: full blocks reused at first starts, every block

    # -- names --------------------------------------------------------------------------------

    def _weights_for(self, end: int) -> _Keys:
        if len(self._weights) < end:
            grown = max(end, 2 * len(self._weights), 1 << 16)
            extra = self._rng.integers(0, 2**64 - 1, grown - len(self._weights), dtype=_U64, endpoint=True)
            self._weights = np.concatenate([self._weights, extra | _U64(1)])
        return self._weights

    def _name(self, state: _Open, tokens: _Tokens) -> tuple[list[int], list[int]]:
        """The names of the sampled blocks that ``tokens`` completes after ``state``'s, and their
        ordinals (0: a prompt's first block); ``state`` moves on past them."""
        tpb = self.tokens_per_block
        first = state.blocks
        if len(state.tail):
            tokens = np.concatenate([state.tail, tokens])
        full = len(tokens) // tpb
        state.tail = tokens[full * tpb :]
        if not full:
            return [], []
        begin = first * tpb
        weights = self._weights_for(begin + full * tpb)[begin : begin + full * tpb]
        with np.errstate(over="ignore"):
            sums = np.cumsum(tokens[: full * tpb].astype(_U64) * weights, dtype=_U64)[tpb - 1 :: tpb]
            sums += _U64(state.prefix)
            ordinals = np.arange(first, first + full, dtype=_U64)
            names = _mix(sums ^ _mix(ordinals ^ _U64(state.scope)))
        state.prefix = int(sums[-1])
        state.blocks += full
        if self._threshold is None:
            return names.tolist(), list(range(first, first + full))
        keep = np.flatnonzero(names < self._threshold)
        return names[keep].tolist(), (keep + first).tolist()

    # -- the stack ----------------------------------------------------------------------------

    def _place(self) -> int:
        """A new place at the back of the queue (the tree doubles as it fills)."""
        self._clock += 1
        if self._clock >= len(self._tree):
            size = 2 * len(self._tree)
            self._tree = [0] * size
            for place in self._stamp.values():
                self._add(place, 1)
        return self._clock

    def _add(self, place: int, delta: int) -> None:
        tree = self._tree
        while place < len(tree):
            tree[place] += delta
            place += place & -place

    def _older_or_same(self, place: int) -> int:
        """Released blocks at ``place`` or before it."""
        tree, total = self._tree, 0
        while place:
            total += tree[place]
            place &= place - 1
        return total

    def _distance(self, name: int) -> int:
        """Sampled pages that stay cached while ``name`` does, itself included: 0 in use
        (always cached), -1 never seen (an unbounded replay reused it: a naming slip)."""
        if self._holders.get(name):
            return 0
        place = self._stamp.get(name)
        if place is None:
            return -1
        return self.in_use + len(self._stamp) - self._older_or_same(place) + 1

    def _hold(self, name: int) -> None:
        held = self._holders.get(name, 0)
        if not held:
            place = self._stamp.pop(name, None)
            if place is not None:
                self._add(place, -1)
            self.in_use += 1
        self._holders[name] = held + 1

    def _release(self, name: int) -> None:
        held = self._holders.pop(name) - 1
        if held:
            self._holders[name] = held
            return
        self.in_use -= 1
        place = self._place()
        self._stamp[name] = place
        self._add(place, 1)

    # -- what the replay tells ----------------------------------------------------------------

    def started(self, cache: int, scope: ReuseScope | None, tokens: _Tokens, reused: int, first: bool) -> None:
        """Cache ``cache`` started with ``tokens``, ``reused`` of them found cached; ``first``:
        the request's first start, whose reuse the report counts."""
        state = _Open(hash(scope) & (2**64 - 1) if scope is not None else 0, 0, 0, tokens[:0])
        names, ordinals = self._name(state, tokens)
        self._open[cache] = state
        state.sampled = names
        matched = reused // self.tokens_per_block
        found = [self._distance(n) for n, o in zip(names, ordinals, strict=True) if o < matched]
        if first:
            self.distances.extend(found)
            self.reused_full_tokens += matched * self.tokens_per_block
            if reused % self.tokens_per_block:
                self.partial.append((max(found, default=0), reused % self.tokens_per_block))
        for name in names:  # reused ones locked, the prefill's committed: every one in use
            self._hold(name)

    def closing(self, cache: int, generated: _Tokens) -> None:
        """Cache ``cache`` closes, having committed ``generated`` after its start's tokens: its
        blocks are released, last first."""
        state = self._open.pop(cache, None)
        if state is None:  # never started
            return
        names, _ = self._name(state, generated)
        for name in names:
            self._hold(name)
        for name in reversed(state.sampled + names):
            self._release(name)
