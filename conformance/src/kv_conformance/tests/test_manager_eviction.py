"""Eviction (invariants 10, 11): lowest priority first, least recently released first within a
priority; held pages are never evicted (a growth cannot count window pages another cache
holds); a full-attention block takes its subtree along, a window page goes alone; a partial tail
another open cache also committed stays that cache's. Observed through what stays reusable."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

import kv_api
from kv_api import StorageStatistics
from kv_api.descriptors import LifeCycle

from ._manager import (
    GRAIN,
    active,
    attention,
    check_accounting,
    check_indices,
    committed,
    fails_atomically,
    hybrid_config,
    make_config,
    make_manager,
    priority,
    toks,
)

TPB = 4


def prefix(i: int) -> list[int]:
    """Block ``i``'s own one-block prefix (distinct first tokens)."""
    return toks(TPB, 1000 * (i + 1))


def reusable(manager: Any, n: int) -> list[bool]:
    return [manager.probe_reuse(None, prefix(i)) == TPB for i in range(n)]


def test_lowest_priority_first(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    for i, value in enumerate([50, 10, 35, 0, 100]):
        committed(manager, prefix(i), callback=priority(value))
    assert manager.get_storage_statistics() == [StorageStatistics(8, 3, 5)]
    cache = active(manager, 3 * TPB)  # free slots first: nothing evicted
    assert reusable(manager, 5) == [True] * 5
    survivors = [
        [True, True, True, False, True],  # priority 0 goes first
        [True, False, True, False, True],  # then 10
        [True, False, False, False, True],  # then 35 (the default)
        [False, False, False, False, True],  # then 50
        [False] * 5,  # even 100 is evictable once nobody holds it
    ]
    for blocks, expected in enumerate(survivors, start=4):
        assert cache.resize(blocks * TPB)
        assert reusable(manager, 5) == expected, blocks
        check_indices(manager, cache)
    assert cache.resize(9 * TPB) is False
    check_accounting(manager)


def test_least_recently_released_first_within_a_priority(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    caches = [active(manager, None, prefix(i)) for i in range(4)]
    for i in (2, 0, 3, 1):
        caches[i].close()
    # Reusing block 0 and letting go again makes it the most recently released.
    manager.create_kv_cache(None, prefix(0)).close()
    order = [2, 3, 1, 0]
    cache = active(manager, 4 * TPB)
    gone: set[int] = set()
    for blocks, victim in enumerate(order, start=5):
        assert cache.resize(blocks * TPB)
        gone.add(victim)
        assert reusable(manager, 4) == [i not in gone for i in range(4)], blocks


def test_reuse_can_raise_priority(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    committed(manager, prefix(0), callback=priority(10))
    committed(manager, prefix(1))  # default 35
    # A reuse whose callback says 60 raises block 0's priority above block 1's.
    manager.create_kv_cache(None, prefix(0), None, priority(60)).close()
    cache = active(manager, 7 * TPB)
    assert reusable(manager, 2) == [True, False]
    cache.close()
    # A lower value does not lower it: block 2 (35) goes before block 0 (60).
    manager.create_kv_cache(None, prefix(0), None, priority(0)).close()
    committed(manager, prefix(2))
    cache = active(manager, 7 * TPB)
    assert reusable(manager, 3) == [True, False, False]
    cache.close()


def test_bad_priorities_are_refused(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    for value, error in ((101, ValueError), (-1, ValueError), ("35", TypeError), (True, TypeError)):

        def bad(ordinal: int, life_cycle: LifeCycle, v: Any = value) -> Any:
            return v

        cache = manager.create_kv_cache(None, None, None, bad)
        assert cache.resume()
        fails_atomically(manager, [cache], partial(cache.resize, TPB), error)
        cache.close()
    not_callable: Any = 35
    with pytest.raises(TypeError):
        manager.create_kv_cache(None, None, None, not_callable)
    check_accounting(manager, open_caches=False)


def test_held_pages_are_never_evicted(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8, max_util_for_resume=1.0))
    committed(manager, prefix(0), callback=priority(0))
    holder = manager.create_kv_cache(None, prefix(0))  # suspended, holding block 0's page
    assert holder.num_committed_tokens == TPB
    assert manager.get_storage_statistics() == [StorageStatistics(8, 7, 0)]
    cache = active(manager, 7 * TPB)
    assert cache.resize(8 * TPB) is False
    assert manager.probe_reuse(None, prefix(0)) == TPB
    # The held page is still there, and locks again without needing a new slot.
    assert holder.resume()
    check_indices(manager, holder)
    holder.suspend()
    cache.close()
    holder.close()
    assert manager.get_storage_statistics() == [StorageStatistics(8, 7, 1)]


@pytest.mark.parametrize("history", [4 * TPB, 3 * TPB], ids=["exact", "one short"])
def test_growth_counts_the_window_pages_it_makes_evictable(backend: kv_api.Backend, history: int) -> None:
    """A resize that grows and moves the history past the window at once fits exactly when the
    free slots plus the committed window pages going stale (evictable then) cover the new
    pages; one slot fewer and it fails, changing nothing."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    cache = active(manager, 2 * TPB, toks(2 * TPB))  # 2 blocks x 2 life cycles, committed
    other = active(manager, 5 * TPB)  # another cache: 10 slots, 2 left free
    assert manager.get_storage_statistics()[0].free == 2
    # Growing to 4 blocks needs 4 new pages; at history 16 the window's blocks 0 and 1 go stale,
    # at history 12 only block 0.
    fits = history == 4 * TPB
    before = (cache.capacity, cache.history_length, list(cache.get_base_page_indices(1)))
    assert cache.resize(4 * TPB, history) is fits
    if fits:
        assert (cache.capacity, cache.history_length) == (4 * TPB, history)
    else:
        assert (cache.capacity, cache.history_length, list(cache.get_base_page_indices(1))) == before
    other.close()


@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
def test_growth_cannot_count_window_pages_another_cache_holds(backend: kv_api.Backend, shared: bool) -> None:
    """As above, exactly tight, but the window pages going stale are also held by another cache
    (it reused them): they stay in use, so the growth fails and changes nothing."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    first = active(manager, 2 * TPB, toks(2 * TPB))
    first.close()
    cache = active(manager, 2 * TPB, reuse=toks(2 * TPB))
    assert cache.num_committed_tokens == 2 * TPB
    holder = active(manager, 2 * TPB, reuse=toks(2 * TPB)) if shared else None
    other = active(manager, 5 * TPB)  # 10 slots: 2 left free
    assert manager.get_storage_statistics()[0].free == 2
    before = (cache.capacity, cache.history_length, list(cache.get_base_page_indices(1)))
    assert cache.resize(4 * TPB, 4 * TPB) is not shared
    if shared:
        assert (cache.capacity, cache.history_length, list(cache.get_base_page_indices(1))) == before
        assert holder is not None
        holder.close()
    other.close()


def test_evicting_a_full_attention_block_removes_its_subtree(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    # A chain of three blocks whose root block has the lowest priority, plus a sibling chain.
    committed(manager, toks(3 * TPB), callback=lambda o, lc: 10 if o == 0 else 90)
    committed(manager, [*toks(TPB), *toks(TPB, 500)], callback=priority(90))
    assert manager.get_storage_statistics() == [StorageStatistics(8, 4, 4)]
    assert manager.probe_reuse(None, toks(3 * TPB)) == 3 * TPB
    cache = active(manager, 5 * TPB)  # one eviction: the root block, so all its descendants too
    assert manager.probe_reuse(None, toks(3 * TPB)) == 0
    assert manager.probe_reuse(None, [*toks(TPB), *toks(TPB, 500)]) == 0
    assert manager.get_storage_statistics() == [StorageStatistics(8, 3, 0)]
    cache.close()


def test_evicting_a_leaf_keeps_its_ancestors(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    committed(manager, toks(3 * TPB), callback=lambda o, lc: 10 if o == 2 else 90)
    cache = active(manager, 6 * TPB)
    assert manager.probe_reuse(None, toks(3 * TPB)) == 2 * TPB
    assert manager.get_storage_statistics() == [StorageStatistics(8, 0, 2)]
    cache.close()


def test_evicting_a_partial_tail_another_open_cache_also_committed(backend: kv_api.Backend) -> None:
    """Two caches commit the same partial tail: the second keeps its own page (partial blocks are
    never rebased), so evicting the tree's page must not pull the block from under it."""
    manager = backend.KVCacheManager(make_config(tokens_per_block=4, slots=6))
    first = manager.create_kv_cache(None, [])
    assert first.resume() and first.resize(6)
    first.commit([1, 2, 3, 4, 5, 6], is_end=True)  # block [1..4] and the partial tail [5, 6]
    first.close()
    second = manager.create_kv_cache(None, [])
    assert second.resume() and second.resize(6)
    second.commit([1, 2, 3, 4, 5, 6], is_end=True)  # rebased onto block 0; the tail already exists
    # Take every free and evictable slot: the tree's page of the tail goes, and its block with it.
    other = manager.create_kv_cache(None, [])
    assert other.resume()
    free = manager.get_storage_statistics()[0]
    assert other.resize(4 * (free.free + free.evictable))
    assert manager.probe_reuse(None, [1, 2, 3, 4, 5, 6]) == 4
    second.close()
    other.close()
    check_accounting(manager, open_caches=False)
    assert manager.probe_reuse(None, [1, 2, 3, 4, 5, 6]) == 4  # the second cache's private tail was freed


def window_first(ordinal: int, life_cycle: LifeCycle) -> int:
    """Block 0's window page is the cheapest page of all."""
    return 0 if life_cycle.window is not None and ordinal == 0 else 50


def test_window_page_eviction_keeps_longer_prefixes(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    committed(manager, toks(4 * TPB), callback=window_first)
    stats = manager.get_storage_statistics()
    assert stats == [StorageStatistics(16, 8, 8)]
    # 5 full-attention pages and 4 window pages (block 0 is stale at history 12): eight free
    # slots plus one eviction, block 0's window page, and nothing else.
    cache = manager.create_kv_cache()
    assert cache.resume()
    assert cache.resize(4 * TPB + 1, 3 * TPB)
    check_indices(manager, cache)
    assert manager.get_storage_statistics() == [StorageStatistics(16, 0, 7)]
    # Endpoints whose window still needs block 0 are no longer reusable; longer ones are,
    # because full attention kept every block (the window page went alone, no subtree).
    for length in (1, 4, 8, 10):
        assert manager.probe_reuse(None, toks(length)) == 0, length
    assert manager.probe_reuse(None, toks(11)) == 11
    assert manager.probe_reuse(None, toks(12)) == 12
    assert manager.probe_reuse(None, toks(16)) == 16
    cache.close()
    check_accounting(manager, open_caches=False)


def test_evicting_a_sink_page_removes_the_subtree(backend: kv_api.Backend) -> None:
    """A sink block's window page is needed by every later endpoint: losing it takes the whole
    subtree, like full attention."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8, sinks=4))
    committed(manager, toks(4 * TPB), callback=window_first)
    assert manager.get_storage_statistics() == [StorageStatistics(16, 8, 8)]
    cache = manager.create_kv_cache()
    assert cache.resume()
    assert cache.resize(4 * TPB + 1, 3 * TPB)  # 10 pages: one eviction, the sink page
    assert manager.get_storage_statistics() == [StorageStatistics(16, 6, 0)]
    for length in (1, 4, 8, 11, 12, 16):
        assert manager.probe_reuse(None, toks(length)) == 0, length
    cache.close()


def test_failing_priority_callback_on_reuse_changes_nothing(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    committed(manager, toks(8))
    probes = [(None, toks(8))]
    fails_atomically(
        manager, [], lambda: manager.create_kv_cache(None, toks(8), None, priority(101)), ValueError, probes
    )
    manager.clear_reusable_blocks()  # no cache was left open
    assert manager.probe_reuse(None, toks(8)) == 0


def test_window_page_evicted_under_a_writing_cache(backend: kv_api.Backend) -> None:
    """Window-only model: block 0's window page goes stale and is committed, so it becomes
    evictable while its cache is still writing block 1; evicting it leaves block 0 with no page
    in any life cycle. Committing block 1 afterwards, and evicting everything later, must work
    and keep the accounting whole (whether block 1 becomes reusable or not)."""
    manager = make_manager(backend, make_config(TPB, layers=[attention(0, GRAIN // 8, window=4)]))
    writer = active(manager, 2 * TPB)
    writer.commit(toks(7))  # at history 7 block 0 is stale for a window of 4
    assert writer.get_base_page_indices(0)[0] == -1
    assert manager.get_storage_statistics() == [StorageStatistics(8, 6, 1)]
    other = active(manager, 7 * TPB)  # six free slots and block 0's window page
    assert manager.get_storage_statistics() == [StorageStatistics(8, 0, 0)]
    writer.commit([7])
    writer.close()
    reusable = manager.probe_reuse(None, toks(8))
    assert reusable in (0, 8)
    probe = manager.create_kv_cache(None, toks(8))
    assert probe.num_committed_tokens == reusable
    probe.close()
    other.close()
    everything = active(manager, 8 * TPB)  # evicts whatever is evictable
    assert manager.get_storage_statistics() == [StorageStatistics(8, 0, 0)]
    everything.close()
    check_accounting(manager, open_caches=False)
    assert manager.probe_reuse(None, toks(8)) == 0
