"""The KV cache state machine (invariants 1, 6, 7, 8, 14): which calls each state allows, lengths
(and their setters), page indices, and failing calls that change nothing."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kv_api
from kv_api import BAD_PAGE_INDEX, KVCacheStatus
from kv_api.constants import ceil_div
from kv_api.errors import InvalidStateError, LogicError, OutOfPagesError

from ._manager import (
    GRAIN,
    active,
    attention,
    cache_state,
    check_accounting,
    check_indices,
    check_lengths,
    committed,
    fails_atomically,
    hybrid_config,
    make_config,
    make_manager,
    raises_exactly,
    snapshot,
    toks,
)

TPB = 4

SUSPENDED_CALLS: dict[str, Callable[[Any], object]] = {
    "resize": lambda c: c.resize(8),
    "resize history": lambda c: c.resize(None, 1),
    "commit": lambda c: c.commit([1]),
    "commit empty": lambda c: c.commit([]),
    "suspend": lambda c: c.suspend(),
}


@pytest.mark.parametrize("call", SUSPENDED_CALLS.values(), ids=SUSPENDED_CALLS.keys())
@pytest.mark.parametrize("reuse", [False, True])
def test_new_cache_is_suspended(backend: kv_api.Backend, call: Callable[[Any], object], reuse: bool) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    committed(manager, toks(6))
    cache = manager.create_kv_cache(None, toks(6) if reuse else None)
    assert cache.status == KVCacheStatus.SUSPENDED
    assert not cache.is_active
    check_lengths(cache)
    check_indices(manager, cache)
    fails_atomically(manager, [cache], lambda: call(cache), InvalidStateError, [(None, toks(6))])
    # After a suspend, the same calls fail the same way.
    assert cache.resume()
    assert cache.is_active
    cache.suspend()
    fails_atomically(manager, [cache], lambda: call(cache), InvalidStateError, [(None, toks(6))])


def test_resume_needs_a_suspended_cache(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 8, toks(6))
    fails_atomically(manager, [cache], cache.resume, InvalidStateError)


CLOSED_CALLS: dict[str, Callable[[Any], object]] = {
    **SUSPENDED_CALLS,
    "resume": lambda c: c.resume(),
}


@pytest.mark.parametrize("call", CLOSED_CALLS.values(), ids=CLOSED_CALLS.keys())
def test_closed_cache_refuses_calls(backend: kv_api.Backend, call: Callable[[Any], object]) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 8, toks(6))
    cache.close()
    assert cache.status == KVCacheStatus.CLOSED
    fails_atomically(manager, [cache], lambda: call(cache), InvalidStateError, [(None, toks(6))])


def test_history_never_decreases(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 12, toks(5))
    assert cache.resize(12, 7)
    assert (cache.num_committed_tokens, cache.history_length, cache.capacity) == (5, 7, 12)
    fails_atomically(manager, [cache], lambda: cache.resize(None, 6), ValueError)
    fails_atomically(manager, [cache], lambda: cache.resize(12, 5), ValueError)
    # Capacity never drops below history, not even together with a history change.
    fails_atomically(manager, [cache], lambda: cache.resize(6), ValueError)
    fails_atomically(manager, [cache], lambda: cache.resize(8, 9), ValueError)
    assert cache.resize(7)
    assert (cache.history_length, cache.capacity, cache.num_blocks) == (7, 7, 2)
    with pytest.raises(ValueError):
        cache.capacity = 6
    assert cache.capacity == 7


def test_commit_raises_history(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 12)
    assert cache.resize(None, 3)
    cache.commit(toks(2))
    assert (cache.num_committed_tokens, cache.history_length) == (2, 3)
    cache.commit(toks(4, 2))
    assert (cache.num_committed_tokens, cache.history_length) == (6, 6)
    check_lengths(cache)


def test_length_setters_change_their_own_length(backend: kv_api.Backend) -> None:
    """``cache.history_length = n`` resizes the history, not the capacity; both setters refuse
    None, a closed cache, and a capacity beyond the pool."""
    manager = make_manager(backend, make_config(TPB, slots=4))
    cache = active(manager, 8, toks(2))
    cache.history_length = 5
    assert (cache.num_committed_tokens, cache.history_length, cache.capacity) == (2, 5, 8)
    cache.capacity = 12
    assert (cache.history_length, cache.capacity) == (5, 12)
    for name in ("history_length", "capacity"):
        with pytest.raises(TypeError):
            setattr(cache, name, None)
    with pytest.raises(OutOfPagesError):
        cache.capacity = 4 * TPB + 1
    assert (cache.history_length, cache.capacity) == (5, 12)
    cache.close()
    assert cache.status == KVCacheStatus.CLOSED
    for name in ("history_length", "capacity"):
        with pytest.raises(InvalidStateError):
            setattr(cache, name, 8)


def test_capacity_setter_out_of_pages_names_the_length(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=4))
    cache = active(manager, 8)

    def grow() -> None:
        cache.capacity = 4 * TPB + 1

    assert str(raises_exactly(OutOfPagesError, grow)) == "capacity: not enough pages"
    assert cache.capacity == 8
    cache.close()


def test_commit_beyond_capacity(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 6, toks(4))
    fails_atomically(manager, [cache], lambda: cache.commit(toks(3, 4)), ValueError, [(None, toks(6))])
    cache.commit(toks(2, 4))
    assert cache.num_committed_tokens == 6
    fails_atomically(manager, [cache], lambda: cache.commit([9]), ValueError, [(None, toks(6))])


@pytest.mark.parametrize("stop", ["stop_committing", "is_end"])
def test_commit_after_stop_committing(backend: kv_api.Backend, stop: str) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 12, toks(2))
    if stop == "is_end":
        cache.commit(toks(4, 2), is_end=True)
    else:
        cache.commit(toks(4, 2))
        cache.stop_committing()
        cache.stop_committing()  # idempotent
    assert cache.num_committed_tokens == 6
    # The partial tail was committed: all six tokens are reusable while the cache is open.
    assert manager.probe_reuse(None, toks(6)) == 6
    fails_atomically(manager, [cache], lambda: cache.commit([7]), LogicError, [(None, toks(7))])
    # Still ACTIVE: resize works.
    assert cache.resize(16)


def test_empty_commit(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 8, toks(6))
    before = cache_state(manager, cache)
    cache.commit([])
    assert cache_state(manager, cache) == before
    assert manager.probe_reuse(None, toks(6)) == 4
    cache.commit([], is_end=True)  # still stops committing: the partial tail enters the tree
    assert manager.probe_reuse(None, toks(6)) == 6
    raises_exactly(LogicError, lambda: cache.commit([6]))


def test_close_commits_the_partial_tail(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 8, toks(6))
    assert manager.probe_reuse(None, toks(6)) == 4
    cache.close()
    assert manager.probe_reuse(None, toks(6)) == 6


def test_close_is_idempotent(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 8, toks(6))
    cache.close()
    before = snapshot(manager, [cache], [(None, toks(6))])
    cache.close()
    cache.stop_committing()
    assert snapshot(manager, [cache], [(None, toks(6))]) == before
    assert cache.status == KVCacheStatus.CLOSED
    check_accounting(manager, open_caches=False)


def test_suspend_hides_indices_and_resume_restores_them(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    cache = active(manager, 14, toks(12))
    check_indices(manager, cache)
    locked = cache_state(manager, cache).indices
    stats = manager.get_storage_statistics()
    cache.suspend()
    assert cache.status == KVCacheStatus.SUSPENDED
    check_indices(manager, cache)
    assert all(i == BAD_PAGE_INDEX for lg in (0, 1) for i in cache.get_base_page_indices(lg))
    # Held pages stay reserved: not free, not evictable.
    assert manager.get_storage_statistics() == stats
    assert cache.resume()
    assert cache_state(manager, cache).indices == locked
    check_indices(manager, cache)


@pytest.mark.parametrize("sinks", [None, 4, 5])
def test_stale_window_blocks_have_no_page(backend: kv_api.Backend, sinks: int | None) -> None:
    manager = make_manager(backend, hybrid_config(TPB, slots=32, window=8, sinks=sinks))
    cache = active(manager, 21)
    for history in (0, 3, 7, 8, 11, 12, 15, 16, 20, 21):
        assert cache.resize(None, history)
        check_lengths(cache)
        check_indices(manager, cache)
    full = list(cache.get_base_page_indices(0))
    window = list(cache.get_base_page_indices(1))
    assert BAD_PAGE_INDEX not in full
    # At history 21 the window needs blocks from (22 - 8) // 4 = 3 on; sink blocks are kept.
    sink_blocks = ceil_div(sinks or 0, TPB)
    assert [i == BAD_PAGE_INDEX for i in window] == [not o < sink_blocks and o < 3 for o in range(6)]


def test_index_buffers_follow_the_indices_with_a_bad_tail(backend: kv_api.Backend) -> None:
    """A caller's buffer longer than the cache's blocks holds the layer group's indices, then
    BAD_PAGE_INDEX to its end, after every call that changes them."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    cache = manager.create_kv_cache(None, [])
    buffers = [array("i", [12345] * 10) for _ in manager.life_cycles]

    def check() -> None:
        for lg, buf in enumerate(buffers):
            indices = list(cache.get_base_page_indices(lg))
            assert list(buf) == indices + [BAD_PAGE_INDEX] * (len(buf) - len(indices)), lg

    for lg, buf in enumerate(buffers):
        cache.set_base_page_index_buf(0, lg, buf)
    check()  # no blocks yet: all of it is the tail
    assert cache.resume()
    assert cache.resize(22)
    check()
    cache.commit(toks(20))  # window blocks turn stale
    check()
    assert cache.resize(20)  # shrinking lengthens the tail
    check()
    cache.suspend()
    check()
    assert cache.resume()
    check()
    cache.close()
    check()


def test_resume_refused_above_max_util(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8, max_util_for_resume=0.5))
    a = active(manager, 4 * TPB)  # 4 of 8 slots in use: 0.5 is not above the limit
    b = manager.create_kv_cache()
    assert b.resume()
    b.suspend()
    assert a.resize(5 * TPB)  # 5 of 8: above
    fails_atomically(manager, [a, b], b.resume)
    assert b.status == KVCacheStatus.SUSPENDED
    assert a.resize(4 * TPB)
    assert b.resume()


def test_resume_gate_is_per_pool_group(backend: kv_api.Backend) -> None:
    # Pool group 0: 8 slots of 256 KiB; pool group 1: 16 slots of 128 KiB.
    layers = [attention(0, 256 * 1024), attention(1, 128 * 1024, window=8)]
    config = make_config(TPB, layers=layers, quota=2 * GRAIN, initial_pool_ratio=(0.5, 0.5), max_util_for_resume=0.5)
    manager = make_manager(backend, config)
    assert [pg.num_slots for pg in manager.pool_group_descs] == [8, 16]
    a = active(manager, 5 * TPB)  # group 0 at 5/8, group 1 at 5/16: 10/24 overall
    b = manager.create_kv_cache()
    fails_atomically(manager, [a, b], b.resume)
    a.close()
    assert b.resume()


def test_resume_out_of_pages(backend: kv_api.Backend) -> None:
    """A reused partial block needs a private page on the first resume; with none left, resume
    returns False and changes nothing."""
    manager = make_manager(backend, make_config(TPB, slots=8, max_util_for_resume=1.0))
    committed(manager, toks(6))  # a full block and the partial tail [4, 5]
    b = manager.create_kv_cache(None, toks(5))
    assert b.num_committed_tokens == 5
    c = active(manager, 6 * TPB)  # every other slot
    assert manager.get_storage_statistics()[0].available == 0
    fails_atomically(manager, [b, c], b.resume, None, [(None, toks(6))])
    assert b.num_committed_tokens == 5
    c.close()
    assert b.resume()
    check_indices(manager, b)


def test_resize_failure_is_atomic(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    committed(manager, toks(8, 100))  # evictable pages, so eviction is attempted too
    a = active(manager, 14, toks(13))
    other = active(manager, 4)
    probes = [(None, toks(8, 100)), (None, toks(13))]
    fails_atomically(manager, [a, other], lambda: a.resize(40), None, probes)
    fails_atomically(manager, [a, other], lambda: a.resize(40, 30), None, probes)
    before = snapshot(manager, [a, other], probes)
    with pytest.raises(OutOfPagesError) as info:
        a.capacity = 40
    assert type(info.value) is OutOfPagesError
    assert snapshot(manager, [a, other], probes) == before
    check_indices(manager, a)


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    ops = st.tuples(st.sampled_from(["resize", "commit", "suspend", "resume"]), st.integers(0, 40), st.integers(0, 40))
    return draw(st.lists(ops, max_size=25))


@given(ops=operations())
def test_lengths_and_indices_hold_after_every_call(backend: kv_api.Backend, ops: list[tuple[str, int, int]]) -> None:
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8, sinks=2))
    committed(manager, toks(9))
    cache = manager.create_kv_cache(None, toks(9))
    for op, x, y in ops:
        before = cache_state(manager, cache)
        result: object = None
        try:
            if op == "resize":
                result = cache.resize(x, max(y, before.history_length) if y % 3 else None)
            elif op == "commit":
                cache.commit(toks(x % 6, cache.num_committed_tokens))
            elif op == "suspend":
                cache.suspend()
            else:
                result = cache.resume()
        except (ValueError, InvalidStateError):
            assert cache_state(manager, cache) == before, op
        if result is False:
            assert cache_state(manager, cache) == before, op
        after = cache_state(manager, cache)
        assert after.history_length >= before.history_length
        assert after.num_committed_tokens >= before.num_committed_tokens
        check_lengths(cache)
        check_indices(manager, cache)
        check_accounting(manager)
    cache.close()
    check_accounting(manager, open_caches=False)


def test_clear_and_shutdown_refused_while_caches_are_open(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    committed(manager, toks(8))
    cache = manager.create_kv_cache(None, toks(4))  # open, even though suspended
    probes = [(None, toks(8))]
    fails_atomically(manager, [cache], manager.clear_reusable_blocks, LogicError, probes)
    fails_atomically(manager, [cache], manager.shutdown, LogicError, probes)
    assert cache.resume()
    fails_atomically(manager, [cache], manager.clear_reusable_blocks, LogicError, probes)
    cache.close()
    manager.clear_reusable_blocks()
    assert manager.probe_reuse(None, toks(8)) == 0
    assert [(s.free, s.evictable) for s in manager.get_storage_statistics()] == [(16, 0)]


def test_shutdown_with_an_open_cache_names_the_call(backend: kv_api.Backend) -> None:
    m = make_manager(backend, make_config(TPB, slots=8))
    cache = active(m, 4)
    assert str(raises_exactly(LogicError, m.shutdown)) == "shutdown() with 1 KV cache(s) still open"
    cache.close()
    m.shutdown()


SHUT_DOWN_CALLS: dict[str, Callable[[Any], object]] = {
    "create_kv_cache": lambda m: m.create_kv_cache(),
    "probe_reuse": lambda m: m.probe_reuse(None, [1, 2]),
    "probe_first_new_block_key": lambda m: m.probe_first_new_block_key(None, toks(8)),
    "get_storage_statistics": lambda m: m.get_storage_statistics(),
    "clear_reusable_blocks": lambda m: m.clear_reusable_blocks(),
    "pool_group_descs": lambda m: m.pool_group_descs,
    "pool_memory": lambda m: m.pool_memory(0, 0),
    "get_mem_pool_base_address": lambda m: m.get_mem_pool_base_address(0, "key"),
    "get_quota": lambda m: m.get_quota(),
    "get_page_stride": lambda m: m.get_page_stride(0, "key"),
    "get_page_index_converter": lambda m: m.get_page_index_converter(0, "key"),
    "get_page_index_upper_bound": lambda m: m.get_page_index_upper_bound(0, "key"),
    "get_layer_group_id": lambda m: m.get_layer_group_id(0),
}


@pytest.mark.parametrize("call", SHUT_DOWN_CALLS.values(), ids=SHUT_DOWN_CALLS.keys())
def test_calls_after_shutdown(backend: kv_api.Backend, call: Callable[[Any], object]) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    committed(manager, toks(8))
    manager.shutdown()
    raises_exactly(InvalidStateError, lambda: call(manager))
    manager.shutdown()  # the one call still allowed
