"""Ints at and beyond the documented ranges (docs/errors.md, "Ranges"): refused with the same
class and message on every backend, never clamped or wrapped, with nothing changed; requests
too large for the pool refused at once; a failing argument conversion commits nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

import kv_api
from kv_api.constants import BAD_PAGE_INDEX, CACHE_ID_LIMIT, EVENT_ENTRIES_LIMIT, TOKEN_LIMIT

from ._manager import GRAIN, active, attention, fails_atomically, make_config, make_manager, snapshot, toks


def outcome(call: Callable[[], object]) -> tuple[type[BaseException], str] | tuple[str, object]:
    try:
        return ("returned", call())
    except Exception as exc:  # noqa: BLE001 - the class and message are what we compare
        return type(exc), str(exc)


def setup(backend: kv_api.Backend) -> tuple[kv_api.KVCacheManager, kv_api.KVCache]:
    manager = make_manager(backend, make_config(slots=16))
    return manager, active(manager, 12, toks(6))


CALLS: list[tuple[str, Callable[[Any, Any], object]]] = [
    ("id 2**63-1", lambda m, c: m.create_kv_cache(None, [1], 2**63 - 1)),
    ("id 2**70", lambda m, c: m.create_kv_cache(None, [1], 2**70)),
    ("id at limit", lambda m, c: m.create_kv_cache(None, [1], CACHE_ID_LIMIT)),
    ("capacity 2**63", lambda m, c: c.resize(2**63)),
    ("capacity 2**63, history 2**100", lambda m, c: c.resize(2**63, 2**100)),
    ("capacity at limit", lambda m, c: c.resize(TOKEN_LIMIT)),
    ("history at limit", lambda m, c: c.resize(None, TOKEN_LIMIT)),
    ("capacity setter 2**64", lambda m, c: setattr(c, "capacity", 2**64)),
    ("history setter -2**70", lambda m, c: setattr(c, "history_length", -(2**70))),
]


@pytest.mark.parametrize("call", [c[1] for c in CALLS], ids=[c[0] for c in CALLS])
def test_out_of_range_is_value_error_everywhere(
    backends: list[kv_api.Backend], call: Callable[[Any, Any], object]
) -> None:
    seen = []
    for backend in backends:
        manager, cache = setup(backend)
        before = snapshot(manager, [cache], probes=[(None, toks(12))])
        result = outcome(partial(call, manager, cache))
        assert result[0] is ValueError, f"{backend.name}: {result}"
        assert snapshot(manager, [cache], probes=[(None, toks(12))]) == before
        seen.append(result)
    assert len(set(seen)) == 1, seen


def test_largest_id_and_the_next_automatic_one(backend: kv_api.Backend) -> None:
    """Automatic ids continue above the largest id given, unwrapped."""
    manager = make_manager(backend)
    assert manager.create_kv_cache(None, [], CACHE_ID_LIMIT - 1).id == CACHE_ID_LIMIT - 1
    assert manager.create_kv_cache().id == CACHE_ID_LIMIT


@pytest.mark.parametrize("capacity", [2**30, TOKEN_LIMIT - 1], ids=["2**30", "limit-1"])
def test_too_large_a_resize_is_refused_at_once(backend: kv_api.Backend, capacity: int) -> None:
    """A 16-slot pool refuses a request for millions of pages in time independent of its size,
    returning False with nothing changed (was seconds and a MemoryError)."""
    manager, cache = setup(backend)
    start = time.perf_counter()
    fails_atomically(manager, [cache], lambda: cache.resize(capacity))
    fails_atomically(manager, [cache], lambda: cache.resize(capacity, capacity))
    assert time.perf_counter() - start < 1.0


def test_window_resize_to_a_long_history_takes_the_window(backend: kv_api.Backend) -> None:
    """A window needs pages only for its last blocks, however long the history: a 16-slot pool
    holds a 2**20-token cache whose window is 8 tokens."""
    manager = make_manager(backend, make_config(slots=16, layers=[attention(0, GRAIN // 16, window=8)]))
    cache = active(manager, 4)
    n = 1 << 20
    assert cache.resize(n, n - 1)
    assert cache.num_blocks == n // 4
    indices = list(cache.get_base_page_indices(0))
    assert [o for o, i in enumerate(indices) if i != BAD_PAGE_INDEX] == [n // 4 - 2, n // 4 - 1]
    [stats] = manager.get_storage_statistics()
    assert stats.total - stats.free == 3  # and block 0's page, held (uncommitted) but unlocked
    cache.close()


@pytest.mark.parametrize(
    "entries",
    [EVENT_ENTRIES_LIMIT, -EVENT_ENTRIES_LIMIT - 1, 2**70, -(2**70)],
    ids=["limit", "below", "2**70", "-2**70"],
)
def test_event_entries_out_of_range(backends: list[kv_api.Backend], entries: int) -> None:
    seen = {outcome(partial(b.KVCacheEventManager, entries)) for b in backends}
    assert len(seen) == 1, seen
    assert next(iter(seen))[0] is ValueError


@pytest.mark.parametrize("entries", [EVENT_ENTRIES_LIMIT - 1, -EVENT_ENTRIES_LIMIT, 0], ids=["max", "min", "zero"])
def test_event_entries_in_range_kept_as_given(backend: kv_api.Backend, entries: int) -> None:
    assert backend.KVCacheEventManager(entries).max_kv_event_entries == entries


class Index:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_event_entries_accept_index(backend: kv_api.Backend) -> None:
    entries: Any = Index(5)
    assert backend.KVCacheEventManager(entries).max_kv_event_entries == 5


TIMEOUTS: list[tuple[str, object]] = [
    ("str", "5"),
    ("bool", True),
    ("nan", float("nan")),
    ("list", [1]),
]


@pytest.mark.parametrize("timeout", [t[1] for t in TIMEOUTS], ids=[t[0] for t in TIMEOUTS])
def test_bad_timeout_same_error(backends: list[kv_api.Backend], timeout: Any) -> None:
    seen = {outcome(partial(b.KVCacheEventManager().get_latest_events, timeout)) for b in backends}
    assert len(seen) == 1, seen
    assert next(iter(seen))[0] in (TypeError, ValueError)


@pytest.mark.parametrize("timeout", [0, -5, -(2**2000), 0.5, 1], ids=["0", "negative", "-2**2000", "0.5", "1"])
def test_timeouts_that_do_not_wait_long(backend: kv_api.Backend, timeout: float) -> None:
    assert backend.KVCacheEventManager().get_latest_events(timeout) == []


class BadBool:
    def __bool__(self) -> bool:
        raise ZeroDivisionError("no truth")


def test_commit_whose_is_end_fails_commits_nothing(backend: kv_api.Backend) -> None:
    """Every argument is converted before anything changes."""
    manager, cache = setup(backend)
    probes = [(None, [*toks(6), 7, 8])]
    bad: Any = BadBool()
    fails_atomically(manager, [cache], lambda: cache.commit([7, 8], bad), ZeroDivisionError, probes)
    assert cache.num_committed_tokens == 6
    assert cache.committed_tokens == toks(6)


def test_native_limits_are_kv_apis() -> None:
    """The bounds the native binding checks are kv_api's (constants.h mirrors them)."""
    core = pytest.importorskip("kv_core_cpp._core")
    assert (core.TOKEN_LIMIT, core.CACHE_ID_LIMIT, core.EVENT_ENTRIES_LIMIT) == (
        TOKEN_LIMIT,
        CACHE_ID_LIMIT,
        EVENT_ENTRIES_LIMIT,
    )
