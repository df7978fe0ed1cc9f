"""A partial block beside a longer sibling (behaviour-spec §3 "Page coverage", docs/manager.md
"Reuse"): a partial commit a sibling extends adds no block; a block extending a partial sibling
replaces it and adopts its pages with their coverage (past a life cycle where it has no page).
Reuse, events, page indices and data agree with that in both orders."""

from __future__ import annotations

from typing import Any

import pytest

import kv_api
from kv_api import StorageStatistics
from kv_api.descriptors import LifeCycle
from kv_api.events import KVCacheEvent, Removed, Stored

from ._manager import (
    GRAIN,
    active,
    attention,
    check_accounting,
    committed,
    fill_slot,
    hybrid_config,
    make_config,
    slot_bytes,
    toks,
)
from .test_manager_events import drain, hashes, setup
from .tiers._helpers import block_hashes

TPB = 4


def summary(events: list[KVCacheEvent]) -> list[tuple[str, int | None, list[Any]]]:
    """``(kind, layer group, block hashes)`` per event; Removed hashes sorted."""
    out: list[tuple[str, int | None, list[Any]]] = []
    for e in events:
        if isinstance(e.data, Stored):
            out.append(("stored", e.layer_group_id, [b.block_hash for b in e.data.blocks]))
        elif isinstance(e.data, Removed):
            out.append(("removed", e.layer_group_id, sorted(e.data.block_hashes)))
    return out


def key(tokens: list[int]) -> Any:
    """The event hash of the last block of ``tokens``."""
    return hashes("v2_sha256", None, tokens)[-1]


SEQUENCE = toks(8, 1)  # [1..8]: block [1, 2, 3, 4], then [5, 6, 7, 8]


@pytest.mark.parametrize("partial", [False, True], ids=["exact", "partial-reuse"])
@pytest.mark.parametrize(("longer", "shorter"), [(8, 6), (7, 6), (8, 5), (7, 5)])
@pytest.mark.parametrize("longer_first", [True, False], ids=["longer-first", "shorter-first"])
def test_one_block_survives_in_either_order(
    backend: kv_api.Backend, longer: int, shorter: int, longer_first: bool, partial: bool
) -> None:
    manager, events = setup(backend, make_config(TPB, slots=16, enable_partial_reuse=partial))
    drain(events)  # Created
    long_tokens, short_tokens = SEQUENCE[:longer], SEQUENCE[:shorter]
    for tokens in (long_tokens, short_tokens) if longer_first else (short_tokens, long_tokens):
        committed(manager, tokens)
    # Only the longer block is left: the shorter endpoint is a prefix of it, reusable through
    # partial reuse only.
    assert manager.probe_reuse(None, short_tokens) == (shorter if partial else TPB)
    assert manager.probe_reuse(None, long_tokens) == longer
    assert manager.probe_reuse(None, SEQUENCE) == (longer if partial or longer == 8 else TPB)
    stats = manager.get_storage_statistics()[0]
    assert (stats.free, stats.evictable) == (stats.total - 2, 2)
    first, second = key(SEQUENCE[:4]), key(long_tokens)
    if longer_first:  # the partial commit adds nothing, so announces nothing
        assert summary(drain(events)) == [("stored", 0, [first, second])]
    else:  # the longer block replaces the announced shorter one
        assert summary(drain(events)) == [
            ("stored", 0, [first, key(short_tokens)]),
            ("removed", 0, [key(short_tokens)]),
            ("stored", 0, [second]),
        ]
    manager.clear_reusable_blocks()
    assert summary(drain(events)) == [("removed", 0, sorted([first, second]))]
    check_accounting(manager, open_caches=False)


def test_a_partial_commit_under_a_longer_sibling_keeps_its_page_private(backend: kv_api.Backend) -> None:
    """The shorter cache's tail page is not committed: it stays the cache's, read as before,
    and is freed (not made evictable) when the cache closes."""
    manager, events = setup(backend, make_config(TPB, slots=16))
    drain(events)  # Created
    committed(manager, SEQUENCE)
    drain(events)
    cache = active(manager, 6, SEQUENCE[:6])  # rebased onto block 0; block 1 is its own
    own = cache.get_base_page_indices(0)[1]
    cache.stop_committing()
    assert cache.get_base_page_indices(0)[1] == own
    assert drain(events) == []
    cache.close()
    stats = manager.get_storage_statistics()[0]
    assert (stats.free, stats.evictable) == (stats.total - 2, 2)


@pytest.mark.parametrize("partial", [False, True], ids=["exact", "partial-reuse"])
def test_adopted_pages_keep_their_coverage(backend: kv_api.Backend, partial: bool) -> None:
    """tpb 4, window 8. A cache commits [0..5]: block 0 and the partial block [4, 5], with a
    page in both layer groups. A second cache runs ahead to history 16 first, so blocks 0 and 1
    get no window page, and commits [0..15]: its block [4..7] replaces [4, 5] and keeps that
    block's window page, valid for 2 tokens; its own full-attention page replaces the other."""
    manager, events = setup(backend, hybrid_config(TPB, slots=16, window=8, enable_partial_reuse=partial))
    drain(events)  # Created
    writer = active(manager, 6)
    writer_slots = [list(writer.get_base_page_indices(lg)) for lg in (0, 1)]
    written = {lg: fill_slot(manager, lg, writer_slots[lg][1], 10 + lg) for lg in (0, 1)}
    writer.commit(toks(6))
    writer.close()
    drain(events)

    runner = manager.create_kv_cache()
    assert runner.resume()
    assert runner.resize(17, 16)
    runner_slots = [list(runner.get_base_page_indices(lg)) for lg in (0, 1)]
    assert runner_slots[1][:2] == [-1, -1]
    full_page = fill_slot(manager, 0, runner_slots[0][1], 20)
    runner.commit(toks(16))
    runner.close()

    # The window page covers [4, 5] of block 1: a match reaching past them is cut to 6 tokens
    # until the window no longer needs block 1 (from history 15 on).
    p = partial
    reuse = {4: 4, 5: 5 if p else 4, 6: 6 if p else 4, 7: 6 if p else 4, 8: 6, 12: 6, 15: 15 if p else 6, 16: 16}
    for length, expected in reuse.items():
        assert manager.probe_reuse(None, toks(length)) == expected, length

    # Reusing the adopted block copies each layer group's page: the window page is the writer's.
    reader = manager.create_kv_cache(None, toks(8))
    assert reader.num_committed_tokens == 6
    assert reader.resume()
    copies = [list(reader.get_base_page_indices(lg))[1] for lg in (0, 1)]
    assert copies[1] not in (writer_slots[1][1], -1)
    assert slot_bytes(manager, 1, copies[1]) == written[1]
    assert copies[0] not in (runner_slots[0][1], -1)
    assert slot_bytes(manager, 0, copies[0]) == full_page
    reader.close()

    # Removed for both of the replaced block's layer groups; Stored for the new block only where
    # its page covers all of it (full attention), so the adopted window page is not announced.
    keys = hashes("v2_sha256", None, toks(16))
    partial_key = key(toks(6))
    got = summary(drain(events))
    assert ("removed", 0, [partial_key]) in got and ("removed", 1, [partial_key]) in got
    stored = {lg: [h for kind, g, hs in got if kind == "stored" and g == lg for h in hs] for lg in (0, 1)}
    assert stored == {0: keys[1:], 1: keys[2:]}

    # A cache committing block 1 with its own window page replaces the narrower one: now the
    # block is whole in both layer groups, announced in the window's too.
    full = active(manager, 9, toks(8))
    assert manager.probe_reuse(None, toks(8)) == 8
    assert summary(drain(events)) == [("stored", 1, [keys[1]])]
    full.close()
    manager.clear_reusable_blocks()
    got = summary(drain(events))
    assert sorted(got) == [("removed", 0, sorted(keys)), ("removed", 1, sorted(keys))]
    check_accounting(manager, open_caches=False)


def test_a_sibling_page_in_use_leaves_with_the_sibling(backend: kv_api.Backend) -> None:
    """The partial block's writer is still open, and a reader holds its page to copy on resume,
    when a longer block replaces it: the page is not adopted (neither cache holds the new
    block's other pages). Both keep using it and it is freed once they let go."""
    manager, events = setup(backend, make_config(TPB, slots=16))
    drain(events)  # Created
    writer = active(manager, 6)
    slot = writer.get_base_page_indices(0)[1]
    written = fill_slot(manager, 0, slot, 5)
    writer.commit(toks(6), is_end=True)
    reader = manager.create_kv_cache(None, toks(6))  # suspended, holding the tree's page
    assert reader.num_committed_tokens == 6
    drain(events)

    committed(manager, toks(8))
    assert summary(drain(events)) == [("removed", 0, [key(toks(6))]), ("stored", 0, [key(toks(8))])]
    assert writer.get_base_page_indices(0)[1] == slot
    assert reader.resume()
    copy = reader.get_base_page_indices(0)[1]
    assert copy != slot and slot_bytes(manager, 0, copy) == written
    reader.close()
    writer.close()
    stats = manager.get_storage_statistics()[0]
    assert (stats.free, stats.evictable) == (stats.total - 2, 2)
    assert manager.probe_reuse(None, toks(6)) == 6  # through the longer block's own page


def window_first(ordinal: int, life_cycle: LifeCycle) -> int:
    """A priority callback: the window's pages are evicted before the full-attention ones."""
    return 10 if life_cycle.window is not None else 50


def test_adopting_a_sibling_without_a_page_in_its_first_life_cycle(backend: kv_api.Backend) -> None:
    """Layer group 0 is a window of 8 tokens, layer group 1 full attention, sharing one pool
    group of 16 slots. A writer commits [0..5] (block 0 and the partial block [4, 5]) with
    window pages of low priority; a cache of 7 blocks (14 pages, 12 free) evicts both window
    pages, which go alone, so the partial block keeps only its full-attention page. A cache
    committing [0..7] then replaces the partial block: the page of layer group 1 is adopted
    past the empty group 0 and, covering 2 tokens only, gives way to the new page (Removed for
    the partial block, its slot freed: the page does not stay with the detached block)."""
    size = GRAIN // 16
    manager, events = setup(backend, make_config(TPB, layers=[attention(0, size, 8), attention(1, size)]))
    assert [(lc.id, lc.window) for lc in manager.life_cycles] == [(0, 8), (1, None)]
    drain(events)  # Created
    committed(manager, toks(6), callback=window_first)
    keys = block_hashes(toks(6))
    assert summary(drain(events)) == [
        ("stored", 0, [keys[0]]),
        ("stored", 1, [keys[0]]),
        ("stored", 0, [keys[1]]),
        ("stored", 1, [keys[1]]),
    ]
    pressure = active(manager, 7 * TPB)
    assert summary(drain(events)) == [("removed", 0, sorted(keys))]
    assert manager.get_storage_statistics() == [StorageStatistics(16, 0, 2)]
    pressure.close()

    committed(manager, toks(8))
    longer = block_hashes(toks(8))
    assert summary(drain(events)) == [
        ("stored", 0, [longer[0]]),
        ("removed", 1, [keys[1]]),
        ("stored", 0, [longer[1]]),
        ("stored", 1, [longer[1]]),
    ]
    # Two blocks with both pages, nothing else kept.
    assert manager.get_storage_statistics() == [StorageStatistics(16, 12, 4)]
    assert manager.probe_reuse(None, toks(8)) == 8
    manager.clear_reusable_blocks()
    assert summary(drain(events)) == [
        ("removed", 0, sorted(longer)),
        ("removed", 1, sorted(longer)),
    ]
    assert manager.get_storage_statistics() == [StorageStatistics(16, 16, 0)]
    check_accounting(manager, open_caches=False)


def test_siblings_keep_insertion_order_through_removals(backend: kv_api.Backend) -> None:
    """A partial match tied between siblings takes the oldest child left (insertion order),
    whatever was removed before it: past the children a node scans (its key index), after gaps
    and their compaction, and once it is back to a few. The tie is observable through the page
    the matching cache copies."""
    manager = backend.KVCacheManager(make_config(TPB, slots=64, enable_partial_reuse=True))
    written: dict[int, bytes] = {}

    def add_child(c: int) -> None:
        # Evicted in insertion order (not least recently used: a match's copy uses its child),
        # the shared first block last.
        by_ordinal = priority_by_ordinal({0: 90, 1: 10 + c})
        cache = active(manager, 2 * TPB, reuse=SEQUENCE[:TPB], callback=by_ordinal)
        written[c] = fill_slot(manager, 0, cache.get_base_page_indices(0)[1], c)
        first = SEQUENCE[cache.num_committed_tokens : TPB]  # the first child commits the parent too
        cache.commit([*first, 5, 6, 7, 100 + c])  # every child shares [5, 6, 7] with the probe
        cache.close()

    def evict(count: int) -> None:
        """The ``count`` oldest children evicted (the pool has no other pages)."""
        free = manager.get_storage_statistics()[0].free
        active(manager, TPB * (free + count)).close()

    def check_the_first_left_is_copied() -> list[int]:
        left = [c for c in written if manager.probe_reuse(None, [*SEQUENCE[:7], 100 + c]) == 8]
        # The copy's source takes the reader's priority: the lowest, as the oldest child's.
        reader = manager.create_kv_cache(None, [*SEQUENCE[:7], 99], None, priority_by_ordinal({0: 90, 1: 0}))
        assert reader.num_committed_tokens == 7
        assert reader.resume()
        assert slot_bytes(manager, 0, reader.get_base_page_indices(0)[1]) == written[left[0]], left
        reader.close()
        return left

    for c in range(20):
        add_child(c)
    assert check_the_first_left_is_copied() == list(range(20))
    evict(5)  # 15 children left, past the scan limit
    assert check_the_first_left_is_copied() == list(range(5, 20))
    for c in range(20, 23):
        add_child(c)
    evict(9)  # the removed now outnumber the children left
    assert check_the_first_left_is_copied() == list(range(14, 23))
    evict(7)  # a few left, no index
    assert check_the_first_left_is_copied() == [21, 22]
    check_accounting(manager, open_caches=False)


def priority_by_ordinal(by_ordinal: dict[int, int]) -> Any:
    """A priority callback: ``by_ordinal``'s value for those blocks, 50 for the others."""
    return lambda ordinal, life_cycle: by_ordinal.get(ordinal, 50)
