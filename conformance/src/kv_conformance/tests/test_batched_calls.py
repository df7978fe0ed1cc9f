"""Batched calls (docs/manager.md, "Batched calls"): ``resize_many``, ``commit_many`` and
``admit_many`` do exactly what the single calls do, one by one in the given order; bad arguments
change nothing; a failing call k leaves calls 0..k-1 done and k..n-1 undone, and raises the
single call's exception with its index attached."""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import kv_api
from kv_api import KVCache, KVCacheManager
from kv_api.errors import InvalidStateError, LogicError

from ._manager import GRAIN, cache_state, make_config, make_manager, raises_exactly, snapshot

pytestmark = pytest.mark.requires("batched_calls")

TPB = 4


def config(**kwargs: Any) -> kv_api.KVCacheManagerConfig:
    return make_config(TPB, slots=24, quota=GRAIN, **kwargs)


def state(manager: KVCacheManager, caches: Sequence[KVCache]) -> tuple[object, ...]:
    """Everything a call may change: statistics, each cache's lengths, pages and tokens, reuse."""
    return (
        snapshot(manager, [c for c in caches if c.status != kv_api.KVCacheStatus.CLOSED]),
        tuple(c.status for c in caches),
        tuple(c.committed_tokens for c in caches),
        manager.get_committed_stats(),
        manager.probe_reuse(None, list(range(100, 140))),
    )


def prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Prompts sharing prefixes with each other (some reuse between them)."""
    base = list(range(100, 140))
    return [base[: rng.randrange(0, 12)] + [rng.randrange(1000) for _ in range(rng.randrange(0, 6))] for _ in range(n)]


def twin_managers(backend: kv_api.Backend, n: int, seed: int) -> tuple[list[KVCacheManager], list[list[KVCache]]]:
    """Two managers in the same state, each with ``n`` active caches (some with a committed prefix)."""
    managers, all_caches = [], []
    for _ in range(2):
        rng = random.Random(seed)
        m = make_manager(backend, config())
        for p in prompts(rng, 3):  # reusable blocks
            c = m.create_kv_cache(None, p)
            assert c.resume() and c.resize(len(p))
            c.commit(p[c.num_committed_tokens :])
            c.close()
        caches = []
        for p in prompts(rng, n):
            c = m.create_kv_cache(None, p)
            assert c.resume()
            caches.append(c)
        managers.append(m)
        all_caches.append(caches)
    return managers, all_caches


@pytest.mark.parametrize("seed", range(6))
def test_resize_many_is_the_single_calls(backend: kv_api.Backend, seed: int) -> None:
    (batched, single), (bc, sc) = twin_managers(backend, 6, seed)
    rng = random.Random(seed)
    for _ in range(5):  # some steps run out of pages: False results, nothing changed for those
        order = rng.sample(range(len(bc)), rng.randrange(0, len(bc) + 1))
        caps: list[int | None] = [
            None if rng.random() < 0.1 else max(bc[i].history_length, bc[i].capacity + rng.randrange(-2, 12))
            for i in order
        ]
        got = batched.resize_many([bc[i] for i in order], caps)
        want = [sc[i].resize(c) for i, c in zip(order, caps, strict=True)]
        assert got == want
        assert state(batched, bc) == state(single, sc)
    assert not all(c.capacity == 0 for c in bc)  # the steps did grow caches


def as_kind(tokens: list[int], kind: str) -> Any:
    """``tokens`` as a token input of one kind (each read as ``commit`` reads it)."""
    return {
        "list": tokens,
        "tuple": tuple(tokens),
        "int32": np.array(tokens, dtype=np.int32),
        "int64": np.array(tokens, dtype=np.int64),
        "array": array("i", tokens),
    }[kind]


@pytest.mark.parametrize("kind", ["list", "int32", "int64", "array", "tuple"])
def test_commit_many_is_the_single_calls(backend: kv_api.Backend, kind: str) -> None:
    (batched, single), (bc, sc) = twin_managers(backend, 5, 7)
    rng = random.Random(1)
    for step in range(4):
        caps = [c.capacity + rng.randrange(0, 9) for c in bc]
        assert batched.resize_many(bc, caps) == [c.resize(cap) for c, cap in zip(sc, caps, strict=True)]
        counts = [rng.randrange(0, c.capacity - c.num_committed_tokens + 1) for c in bc]
        flat = [rng.randrange(0, 1000) for _ in range(sum(counts))]
        tokens = as_kind(flat, kind)
        end = step == 3
        batched.commit_many(bc, tokens, counts, is_end=end)
        begin = 0
        for c, n in zip(sc, counts, strict=True):
            c.commit(flat[begin : begin + n], end)
            begin += n
        assert state(batched, bc) == state(single, sc)
    assert sum(c.num_committed_tokens for c in bc) > 0
    for cs in (bc, sc):
        for c in cs:
            c.close()
    assert state(batched, bc) == state(single, sc)  # what the commits left reusable


def test_admit_many_is_create_kv_cache(backend: kv_api.Backend) -> None:
    (batched, single), _ = twin_managers(backend, 0, 3)
    rng = random.Random(3)
    ps: list[Any] = prompts(rng, 6)
    ps[2] = np.array(ps[2], dtype=np.int32)
    ps[4] = None
    scopes = [None, kv_api.ReuseScope(lora_id=1), None, None, None, None]
    ids = [None, 50, None, 7, None, None]
    calls: dict[str, list[tuple[int, int]]] = {"batched": [], "single": []}

    def callback(seen: list[tuple[int, int]]) -> Callable[[int, Any], int]:
        def priority(ordinal: int, life_cycle: Any) -> int:
            seen.append((ordinal, life_cycle.id))
            return 40

        return priority

    def with_callback(seen: list[tuple[int, int]]) -> list[Any]:
        return [None, None, callback(seen), None, None, None]

    got = batched.admit_many(scopes, ps, ids, with_callback(calls["batched"]))
    want = [
        single.create_kv_cache(s, p, i, cb)
        for s, p, i, cb in zip(scopes, ps, ids, with_callback(calls["single"]), strict=True)
    ]
    assert [(c.id, c.status, c.reuse_scope, c.committed_tokens) for c in got] == [
        (c.id, c.status, c.reuse_scope, c.committed_tokens) for c in want
    ]
    assert any(c.num_committed_tokens for c in got)
    assert state(batched, got) == state(single, want)
    # The callbacks were kept with their caches: the same pages get the same priorities.
    for cs in (got, want):
        assert cs[2].resume() and cs[2].resize(cs[2].num_committed_tokens + 8)
    assert calls["batched"] and calls["batched"] == calls["single"]
    assert state(batched, got) == state(single, want)
    # Defaults for ids and callbacks.
    assert [c.id for c in batched.admit_many((None, None), ([1], [2]))] == [
        single.create_kv_cache(None, [1]).id,
        single.create_kv_cache(None, [2]).id,
    ]
    assert batched.admit_many([], []) == []


# -- partial failure ------------------------------------------------------------------------------


def check_partial(
    backend: kv_api.Backend,
    setup: Callable[[KVCacheManager, list[KVCache]], object],
    batch: Callable[[KVCacheManager, list[KVCache]], object],
    singles: Callable[[list[KVCache]], list[object]],
    error: type[BaseException],
    index: int,
) -> BaseException:
    """``batch`` raises ``error`` at ``index``: the manager then equals its twin that made the
    single calls before ``index`` (``singles``, which returns their results) and nothing else."""
    (batched, single), (bc, sc) = twin_managers(backend, 5, 11)
    setup(batched, bc)
    setup(single, sc)
    e = raises_exactly(error, lambda: batch(batched, bc))
    results = singles(sc)
    assert getattr(e, "batch_index", None) == index
    assert getattr(e, "batch_results", None) == results
    tail = f"call {index} of 5 raised this; the {index} before it took effect, it and the {4 - index} after it did not"
    assert e.__notes__[-1] in {f"{api}: {tail}" for api in ("resize_many", "commit_many")}, e.__notes__
    assert state(batched, bc) == state(single, sc)
    return e


def test_resize_many_stops_at_a_suspended_cache(backend: kv_api.Backend) -> None:
    e = check_partial(
        backend,
        lambda m, cs: cs[2].suspend(),
        lambda m, cs: m.resize_many(cs, [8, 8, 8, 8, 8]),
        lambda cs: [cs[0].resize(8), cs[1].resize(8)],
        InvalidStateError,
        2,
    )
    assert str(e) == "resize() requires a ACTIVE cache (status: SUSPENDED)"


def test_resize_many_stops_at_a_capacity_below_history(backend: kv_api.Backend) -> None:
    def setup(m: KVCacheManager, cs: list[KVCache]) -> None:
        assert cs[3].resize(cs[3].num_committed_tokens + 6)
        cs[3].history_length = cs[3].num_committed_tokens + 5

    e = check_partial(
        backend,
        setup,
        lambda m, cs: m.resize_many(cs, [c.capacity + 4 for c in cs[:3]] + [cs[3].history_length - 1, 9]),
        lambda cs: [c.resize(c.capacity + 4) for c in cs[:3]],
        ValueError,
        3,
    )
    assert str(e).startswith("capacity: ")


def test_resize_many_out_of_pages_is_a_result(backend: kv_api.Backend) -> None:
    (batched, single), (bc, sc) = twin_managers(backend, 3, 5)
    caps = [c.capacity + 4 for c in bc]
    caps[1] = 10_000  # far beyond the pool: False, nothing changed for it
    assert batched.resize_many(bc, caps) == [True, False, True]
    assert [c.resize(cap) for c, cap in zip(sc, caps, strict=True)] == [True, False, True]
    assert state(batched, bc) == state(single, sc)


def test_commit_many_stops_past_capacity(backend: kv_api.Backend) -> None:
    def commits(cs: list[KVCache]) -> list[object]:
        cs[0].commit([0, 1])
        return [None]

    e = check_partial(
        backend,
        lambda m, cs: [c.resize(c.num_committed_tokens + 2) for c in cs],
        lambda m, cs: m.commit_many(cs, np.arange(10, dtype=np.int32), [2, 3, 2, 2, 1]),
        commits,
        ValueError,
        1,
    )
    assert "exceed capacity" in str(e)


def test_commit_many_stops_after_stop_committing(backend: kv_api.Backend) -> None:
    def commits(cs: list[KVCache]) -> list[object]:
        for c, t in zip(cs[:4], ([1], [2], [3], [4]), strict=True):
            c.commit(t)
        return [None] * 4

    e = check_partial(
        backend,
        lambda m, cs: ([c.resize(c.num_committed_tokens + 2) for c in cs], cs[4].stop_committing()),
        lambda m, cs: m.commit_many(cs, [1, 2, 3, 4, 5], [1] * 5),
        commits,
        LogicError,
        4,
    )
    assert str(e) == "Cannot commit tokens after stop_committing()"


def test_admit_many_stops_at_a_digest_in_a_text_only_manager(backend: kv_api.Backend) -> None:
    m = make_manager(backend, config(text_only=True))
    digest = bytes(range(32))
    e = raises_exactly(ValueError, lambda: m.admit_many([None] * 3, [[1, 2], [3, digest], [4]]))
    assert getattr(e, "batch_index", None) == 1
    created = getattr(e, "batch_results", None)
    assert isinstance(created, list) and len(created) == 1
    assert m.num_open_kv_caches == 1  # the first was created (and is the caller's to close)
    assert created[0].committed_tokens == [] and created[0].status == kv_api.KVCacheStatus.SUSPENDED
    assert getattr(e, "__notes__", None) == [
        "admit_many: call 1 of 3 raised this; the 1 before it took effect, it and the 1 after it did not"
    ]
    created[0].close()
    assert m.num_open_kv_caches == 0


# -- bad arguments change nothing -------------------------------------------------------------------


def bad_calls(m: Any, cs: list[KVCache], other: KVCache) -> dict[str, Callable[[], object]]:
    three = cs[:3]
    return {
        "caches not a list": lambda: m.resize_many(iter(three), [1, 2, 3]),
        "capacities a dict": lambda: m.resize_many(three, {0: 1}),
        "lengths differ": lambda: m.resize_many(three, [9, 9]),
        "not a cache": lambda: m.resize_many([three[0], "x"], [9, 9]),
        "other manager's cache": lambda: m.resize_many([three[0], other], [9, 9]),
        "capacity not an int": lambda: m.resize_many(three, [9, 9.5, 9]),
        "capacity out of range": lambda: m.resize_many(three, [9, 9, -1]),
        "counts differ in length": lambda: m.commit_many(three, [1, 2], [1, 1]),
        "commit caches a set": lambda: m.commit_many({three[0]}, [1], [1]),
        "counts a str": lambda: m.commit_many(three, [1, 2], "ab"),
        "commit to a foreign cache": lambda: m.commit_many([three[0], other], [1, 2], [1, 1]),
        "count negative": lambda: m.commit_many(three, [1, 2], [1, 2, -1]),
        "count bool": lambda: m.commit_many(three, [1, 2], [1, True, 0]),
        "counts sum": lambda: m.commit_many(three, [1, 2, 3], [1, 1, 0]),
        "token out of range": lambda: m.commit_many(three, [1, -2, 3], [1, 1, 1]),
        "tokens None": lambda: m.commit_many(three, None, [0, 0, 0]),
        "tokens 2-D": lambda: m.commit_many(three, np.zeros((1, 3), dtype=np.int32), [1, 1, 1]),
        "is_end raises": lambda: m.commit_many(three, [1, 2, 3], [1, 1, 1], is_end=np.array([1, 2])),
        "scopes a str": lambda: m.admit_many("ab", ["a", "b"]),
        "prompts shorter": lambda: m.admit_many([None, None], [[1]]),
        "bad scope": lambda: m.admit_many([None, 3], [[1], [2]]),
        "bad prompt": lambda: m.admit_many([None, None], [[1], "xy"]),
        "bad id": lambda: m.admit_many([None, None], [[1], [2]], [None, -1]),
        "ids shorter": lambda: m.admit_many([None, None], [[1], [2]], [None]),
        "prompts a str": lambda: m.admit_many([None, None], "ab"),
        "ids a dict": lambda: m.admit_many([None, None], [[1], [2]], {0: 1}),
        "callbacks a str": lambda: m.admit_many([None, None], [[1], [2]], None, "ab"),
        "callbacks shorter": lambda: m.admit_many([None, None], [[1], [2]], None, [None]),
        "bad callback": lambda: m.admit_many([None, None], [[1], [2]], None, [None, 3]),
    }


BadCalls = Callable[[Any, list[KVCache], KVCache], dict[str, Callable[[], object]]]


def refusals(backend: kv_api.Backend, bad_calls: BadCalls) -> dict[str, tuple[str, str, list[str]]]:
    """What each of ``bad_calls(manager, its four caches, another manager's cache)`` raised
    (class, message, notes), each checked to have changed nothing."""
    (m, _m2), (cs, cs2) = twin_managers(backend, 4, 2)
    for c in cs:
        assert c.resize(c.num_committed_tokens + 4)
    out = {}
    for name, call in bad_calls(m, cs, cs2[0]).items():
        before = state(m, cs), m.num_open_kv_caches
        with pytest.raises((TypeError, ValueError)) as info:
            call()
        assert (state(m, cs), m.num_open_kv_caches) == before, name
        assert not hasattr(info.value, "batch_index"), name
        out[name] = (type(info.value).__name__, str(info.value), getattr(info.value, "__notes__", []))
    return out


def test_bad_arguments_change_nothing_and_match_across_backends(backends: list[kv_api.Backend]) -> None:
    seen: list[dict[str, tuple[str, str, list[str]]]] = []
    for backend in backends:
        out = refusals(backend, bad_calls)
        seen.append(out)
        # The item checks say where (their messages are the single call's).
        assert out["capacity not an int"] == (
            "TypeError",
            "capacity: expected an int, got float",
            ["resize_many: in capacities[1]; nothing changed"],
        )
        assert out["other manager's cache"] == ("ValueError", "caches[1]: belongs to another manager", [])
        assert out["counts sum"] == ("ValueError", "counts: add up to 2 but tokens holds 3", [])
        assert out["bad id"][2] == ["admit_many: in ids[1]; nothing changed"]
        assert out["lengths differ"] == ("ValueError", "capacities: 2 items for 3 caches", [])
        assert out["commit caches a set"] == ("TypeError", "caches: expected a list or tuple, got set", [])
        assert out["counts a str"] == ("TypeError", "counts: expected a list or tuple, got str", [])
        assert out["commit to a foreign cache"] == ("ValueError", "caches[1]: belongs to another manager", [])
        assert out["prompts a str"] == ("TypeError", "prompts: expected a list or tuple, got str", [])
        assert out["ids a dict"] == ("TypeError", "ids: expected a list or tuple, got dict", [])
        assert out["callbacks a str"] == ("TypeError", "priority_callbacks: expected a list or tuple, got str", [])
        assert out["callbacks shorter"] == ("ValueError", "priority_callbacks: 1 items for 2 reuse_scopes", [])
    for other in seen[1:]:
        assert other == seen[0]


def test_foreign_backend_cache_is_a_type_error(backends: list[kv_api.Backend]) -> None:
    if len(backends) < 2:
        pytest.skip("needs two backends")
    a, b = (make_manager(x, config()) for x in backends[:2])
    ca = a.create_kv_cache(None, [1])
    e = raises_exactly(TypeError, lambda: b.resize_many([ca], [4]))
    assert str(e) == "caches[0]: expected this backend's KVCache, got KVCache"
    ca.close()


def test_a_list_mutated_by_index_is_read_as_it_was(backend: kv_api.Backend) -> None:
    m = make_manager(backend, config())
    cs = m.admit_many([None, None], [[], []])
    for c in cs:
        assert c.resume()
    caps: list[Any] = []

    class Sneaky:
        def __index__(self) -> int:
            caps.clear()  # the batch read a copy: the second capacity is still there
            return 5

    caps.extend([Sneaky(), 6])
    assert m.resize_many(cs, caps) == [True, True]
    assert [c.capacity for c in cs] == [5, 6]
    tokens: list[Any] = [1, 2]

    class Grow:
        def __index__(self) -> int:
            tokens.append(9)  # read as commit reads a list: the new item counts
            return 3

    tokens.append(Grow())
    m.commit_many(cs, tokens, [2, 2])
    assert [c.committed_tokens for c in cs] == [[1, 2], [3, 9]]


def test_shut_down_manager(backend: kv_api.Backend) -> None:
    m = make_manager(backend, config())
    m.shutdown()
    for call in (lambda: m.resize_many([], []), lambda: m.commit_many([], [], []), lambda: m.admit_many([], [])):
        raises_exactly(InvalidStateError, call)


def test_closed_cache_in_the_middle(backend: kv_api.Backend) -> None:
    (batched, single), (bc, sc) = twin_managers(backend, 3, 4)
    bc[1].close()
    sc[1].close()
    e = raises_exactly(InvalidStateError, lambda: batched.resize_many(bc, [8, 8, 8]))
    assert getattr(e, "batch_results", None) == [sc[0].resize(8)]
    assert cache_state(batched, bc[2]) == cache_state(single, sc[2])
    assert state(batched, bc) == state(single, sc)
