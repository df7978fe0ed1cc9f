"""``decode_steps`` (docs/manager.md, "Batched calls"): up to ``steps`` decode iterations in one
call, each exactly ``resize_many`` to one token past what every cache committed (never below its
capacity) and, when every resize succeeded, ``commit_many`` of one token each; it stops at the
first iteration whose resizes did not all succeed, and reads the device level's slots after each
iteration that ran."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pytest

import kv_api
from kv_api import KVCache, KVCacheManager
from kv_api.errors import InvalidStateError, LogicError

from ._manager import make_manager, raises_exactly
from .test_batched_calls import as_kind, config, refusals, state, twin_managers

pytestmark = pytest.mark.requires("batched_calls")


def looped(
    manager: KVCacheManager,
    caches: Sequence[KVCache],
    tokens: list[int],
    steps: int,
    until_room: list[int] | None = None,
) -> kv_api.DecodeSteps:
    """What ``decode_steps`` is defined as, one batched call at a time."""
    n = len(caches)
    free: list[list[int]] = []
    evictable: list[list[int]] = []
    for k in range(steps):
        try:
            resized = manager.resize_many(caches, [max(c.capacity, c.num_committed_tokens + 1) for c in caches])
            if not all(resized):
                return kv_api.DecodeSteps(k, resized, free, evictable)
            manager.commit_many(caches, tokens[k * n : (k + 1) * n], [1] * n)
        except Exception as e:
            e.add_note(f"decode_steps: in iteration {k} of {steps}; the {k} before it took effect")
            raise
        stats = manager.get_storage_statistics()
        free.append([s.free for s in stats])
        evictable.append([s.evictable for s in stats])
        if until_room is not None and any(s.available > r for s, r in zip(stats, until_room, strict=True)):
            return kv_api.DecodeSteps(k + 1, [], free, evictable)
    return kv_api.DecodeSteps(steps, [], free, evictable)


def outcome(call: Callable[[], kv_api.DecodeSteps]) -> tuple[kv_api.DecodeSteps | None, Any]:
    """The call's result, or what it raised (class, message, notes, where the batch stopped)."""
    try:
        return call(), None
    except (ValueError, LogicError) as e:
        return None, (type(e), str(e), getattr(e, "__notes__", []), getattr(e, "batch_index", None))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["list", "int32", "int64", "array", "tuple"])
def test_decode_steps_is_the_loop_of_batched_calls(backend: kv_api.Backend, seed: int, kind: str) -> None:
    # 24 slots of 4 tokens: the caches run out of pages within a few calls, so runs stop early.
    (batched, single), (bc, sc) = twin_managers(backend, 5, seed)
    rng = random.Random(seed)
    stopped = ran = 0
    for _ in range(10):
        order = rng.sample(range(len(bc)), rng.randrange(0, len(bc) + 1))
        if rng.random() < 0.15 and order:
            order.append(order[0])  # a cache twice: its two resizes and commits in order
        steps = rng.randrange(0, 30)
        tokens = [rng.randrange(0, 1000) for _ in range(steps * len(order))]
        picked, twins = [bc[i] for i in order], [sc[i] for i in order]
        got = outcome(partial(batched.decode_steps, picked, as_kind(tokens, kind), steps))
        want = outcome(partial(looped, single, twins, tokens, steps))
        assert got == want  # a cache twice commits two tokens to a capacity of one: both raise
        assert state(batched, bc) == state(single, sc)
        run = got[0]
        if run is None:
            continue
        stopped += bool(run.resized)
        ran += run.steps
        if run.resized and len(bc) > 1:  # room for the next calls: the newest cache goes
            for cs in (bc, sc):
                cs.pop().close()
    assert ran > 0 and stopped > 0
    for cs in (bc, sc):
        for c in cs:
            c.close()
    assert state(batched, bc) == state(single, sc)  # what the commits left reusable


@pytest.mark.parametrize("seed", range(4))
def test_until_room_stops_after_an_iteration_that_leaves_more(backend: kv_api.Backend, seed: int) -> None:
    # A decode that rebases onto the tree's blocks frees its own pages: the committed prompts'
    # tokens decoded again (twin_managers commits prompts of base tokens 100..139).
    (batched, single), (bc, sc) = twin_managers(backend, 2, seed)
    rng = random.Random(seed)
    stopped = 0
    for _ in range(6):
        room = [s.available + rng.randrange(-2, 2) for s in batched.get_storage_statistics()]
        room = [max(r, 0) for r in room]
        steps = rng.randrange(1, 12)
        tokens = [100 + rng.randrange(0, 40) if rng.random() < 0.5 else rng.randrange(1000) for _ in range(2 * steps)]
        got = outcome(partial(batched.decode_steps, bc, tokens, steps, room))
        want = outcome(partial(looped, single, sc, tokens, steps, room))
        assert got == want
        assert state(batched, bc) == state(single, sc)
        run = got[0]
        stopped += run is not None and not run.resized and run.steps < steps
    assert stopped > 0


def test_until_room_that_never_grows_runs_them_all(backend: kv_api.Backend) -> None:
    (m, _), (cs, _) = twin_managers(backend, 2, 1)
    total = [s.total for s in m.get_storage_statistics()]
    got = m.decode_steps(cs, list(range(8)), 4, total)  # more room than the pool has: never
    assert got.steps == 4 and got.resized == []


def test_decode_steps_runs_out_of_pages(backend: kv_api.Backend) -> None:
    (batched, single), (bc, sc) = twin_managers(backend, 3, 5)
    got = batched.decode_steps(bc, list(range(3 * 200)), 200)  # 24 slots cannot hold 3 * 200 tokens
    assert got == looped(single, sc, list(range(3 * 200)), 200)
    assert 0 < got.steps < 200 and not all(got.resized)
    assert len(got.free) == len(got.evictable) == got.steps
    assert state(batched, bc) == state(single, sc)


def test_decode_steps_never_shrinks_a_capacity(backend: kv_api.Backend) -> None:
    (m, _), (cs, _) = twin_managers(backend, 2, 1)
    assert cs[0].resize(cs[0].num_committed_tokens + 9)
    ahead = cs[0].capacity
    got = m.decode_steps(cs, [7, 8, 9, 10], 2)
    assert got.steps == 2 and got.resized == []
    assert cs[0].capacity == ahead  # resized to its own capacity, not to committed + 1
    assert cs[1].capacity == cs[1].num_committed_tokens
    assert [c.committed_tokens[-2:] for c in cs] == [[7, 9], [8, 10]]


def test_nothing_to_do(backend: kv_api.Backend) -> None:
    (m, _), (cs, _) = twin_managers(backend, 2, 3)
    before = state(m, cs)
    assert m.decode_steps(cs, [], 0) == kv_api.DecodeSteps(0, [], [], [])
    assert state(m, cs) == before
    stats = m.get_storage_statistics()
    assert m.decode_steps([], [], 2) == kv_api.DecodeSteps(
        2, [], [[s.free for s in stats]] * 2, [[s.evictable for s in stats]] * 2
    )


def bad_calls(m: Any, cs: list[KVCache], foreign: KVCache) -> dict[str, Callable[[], object]]:
    return {
        "caches a set": lambda: m.decode_steps(set(cs), [], 0),
        "caches None": lambda: m.decode_steps(None, [], 0),
        "not a cache": lambda: m.decode_steps([cs[0], 3], [1, 2], 1),
        "other manager's cache": lambda: m.decode_steps([cs[0], foreign], [1, 2], 1),
        "steps negative": lambda: m.decode_steps(cs, [], -1),
        "steps a float": lambda: m.decode_steps(cs, [], 1.0),
        "steps None": lambda: m.decode_steps(cs, [], None),
        "too few tokens": lambda: m.decode_steps(cs, [1, 2, 3], 1),
        "too many tokens": lambda: m.decode_steps(cs[:1], [1, 2, 3], 2),
        "token out of range": lambda: m.decode_steps(cs[:2], [1, -2], 1),
        "tokens None": lambda: m.decode_steps(cs, None, 0),
        "tokens 2-D": lambda: m.decode_steps(cs[:2], np.zeros((1, 2), dtype=np.int32), 1),
        "until_room a set": lambda: m.decode_steps(cs[:1], [1], 1, {1}),
        "until_room longer": lambda: m.decode_steps(cs[:1], [1], 1, [1, 2]),
        "until_room negative": lambda: m.decode_steps(cs[:1], [1], 1, [-1]),
        "until_room a float": lambda: m.decode_steps(cs[:1], [1], 1, [1.5]),
    }


def test_bad_arguments_change_nothing_and_match_across_backends(backends: list[kv_api.Backend]) -> None:
    seen: list[dict[str, tuple[str, str, list[str]]]] = []
    for backend in backends:
        out = refusals(backend, bad_calls)
        seen.append(out)
        assert out["caches a set"] == ("TypeError", "caches: expected a list or tuple, got set", [])
        assert out["other manager's cache"] == ("ValueError", "caches[1]: belongs to another manager", [])
        assert out["too few tokens"] == ("ValueError", "tokens: holds 3 for 4 caches times 1 steps", [])
        assert out["too many tokens"] == ("ValueError", "tokens: holds 3 for 1 caches times 2 steps", [])
        assert out["steps negative"][:2] == ("ValueError", "steps: must be in [0, 1099511627776) (got -1)")
        assert out["until_room longer"] == ("ValueError", "until_room: 2 items for 1 pool groups", [])
        assert out["until_room negative"][:2] == (
            "ValueError",
            "until_room[0]: must be in [0, 1099511627776) (got -1)",
        )
    for other in seen[1:]:
        assert other == seen[0]


def two_caches(backend: kv_api.Backend) -> tuple[KVCacheManager, list[KVCache]]:
    """Two caches of 6 committed tokens each (two blocks of 4), the second's page indices kept in
    a buffer of two: its resize past 8 tokens raises."""
    m = make_manager(backend, config())
    cs = []
    for i in range(2):
        c = m.create_kv_cache(None, [])
        assert c.resume() and c.resize(6)
        c.commit(list(range(10 * i, 10 * i + 6)))
        cs.append(c)
    cs[1].set_base_page_index_buf(0, 0, np.zeros(2, dtype=np.int32))
    return m, cs


def test_a_failing_call_ends_it_with_the_iteration_named(backend: kv_api.Backend) -> None:
    (batched, bc), (single, sc) = two_caches(backend), two_caches(backend)
    tokens = list(range(100, 108))
    e = raises_exactly(ValueError, lambda: batched.decode_steps(bc, tokens, 4))
    assert getattr(e, "batch_index", None) == 1
    assert getattr(e, "batch_results", None) == [True]
    assert getattr(e, "__notes__", []) == [
        "resize_many: call 1 of 2 raised this; the 1 before it took effect, it and the 0 after it did not",
        "decode_steps: in iteration 2 of 4; the 2 before it took effect",
    ]
    want = raises_exactly(ValueError, lambda: looped(single, sc, tokens, 4))
    assert str(e) == str(want)
    assert state(batched, bc) == state(single, sc)
    assert [c.num_committed_tokens for c in bc] == [8, 8] and bc[0].capacity == 9


def test_a_commit_that_may_not_be_made_ends_it(backend: kv_api.Backend) -> None:
    (batched, bc), (single, sc) = two_caches(backend), two_caches(backend)
    for c in bc[0], sc[0]:
        c.stop_committing()
    e = raises_exactly(LogicError, lambda: batched.decode_steps(bc, [1, 2], 1))
    assert str(e) == "Cannot commit tokens after stop_committing()"
    assert getattr(e, "batch_index", None) == 0
    assert getattr(e, "batch_results", None) == []
    assert getattr(e, "__notes__", [])[-1] == "decode_steps: in iteration 0 of 1; the 0 before it took effect"
    raises_exactly(LogicError, lambda: looped(single, sc, [1, 2], 1))
    assert state(batched, bc) == state(single, sc)


def test_a_suspended_cache_stops_the_first_resize(backend: kv_api.Backend) -> None:
    (m, _), (cs, _) = twin_managers(backend, 3, 4)
    cs[2].suspend()
    e = raises_exactly(InvalidStateError, lambda: m.decode_steps(cs, [1, 2, 3], 1))
    assert str(e) == "resize() requires a ACTIVE cache (status: SUSPENDED)"
    assert getattr(e, "batch_index", None) == 2
    assert getattr(e, "__notes__", [])[-1] == "decode_steps: in iteration 0 of 1; the 0 before it took effect"


def test_shut_down_manager(backend: kv_api.Backend) -> None:
    m = make_manager(backend, config())
    m.shutdown()
    raises_exactly(InvalidStateError, lambda: m.decode_steps([], [], 0))
