"""Reuse through the radix tree (invariants 3, 4, 5): exact and partial matches, probes that
change nothing, scopes that never share, backoff, the first-new-block probe, and windowed layers
that reuse only where their window pages exist; stale window pages held until committed, and
freed once they cannot be."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kv_api
from kv_api import KVCacheStatus, ReuseScope, StorageStatistics
from kv_api.events import Stored, UniqueToken

from ._manager import (
    GRAIN,
    active,
    attention,
    check_accounting,
    check_lengths,
    check_page_levels,
    committed,
    hybrid_config,
    make_config,
    make_manager,
    snapshot,
    toks,
)

TPB = 4


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_exact_reuse_after_close(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    tokens = toks(10)
    committed(manager, tokens)
    assert manager.probe_reuse(None, tokens) == 10
    cache = manager.create_kv_cache(None, tokens)
    assert cache.status == KVCacheStatus.SUSPENDED
    assert (cache.num_committed_tokens, cache.history_length, cache.capacity, cache.num_blocks) == (10, 10, 10, 3)
    assert list(cache.committed_tokens) == tokens
    assert cache.resume()
    check_lengths(cache)
    cache.close()
    # Without input tokens nothing is reused.
    empty = manager.create_kv_cache()
    assert (empty.num_committed_tokens, empty.capacity, empty.num_blocks) == (0, 0, 0)
    empty.close()
    assert manager.probe_reuse() == 0
    assert manager.probe_reuse(None, []) == 0


def test_reuse_continues_a_chain(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    committed(manager, toks(8))
    cache = active(manager, None, toks(8, 8), reuse=toks(8))
    assert cache.num_committed_tokens == 16
    cache.close()
    assert manager.probe_reuse(None, toks(16)) == 16
    assert manager.probe_reuse(None, toks(20)) == 16
    assert manager.probe_reuse(None, [*toks(8), 99]) == 8


def build_tree(manager: Any, sequences: list[list[int]]) -> None:
    """Commit each sequence in turn, reusing what the tree already has, then close."""
    for seq in sequences:
        cache = manager.create_kv_cache(None, seq)
        assert cache.resume()
        assert cache.resize(len(seq))
        cache.commit(seq[cache.num_committed_tokens :])
        cache.close()


SEQUENCES = st.lists(st.lists(st.integers(0, 2), max_size=14), min_size=1, max_size=3)
QUERIES = st.lists(st.lists(st.integers(0, 2), max_size=16), min_size=1, max_size=6)


@given(sequences=SEQUENCES, queries=QUERIES, partial=st.booleans())
def test_probe_matches_create_and_changes_nothing(
    backend: kv_api.Backend, sequences: list[list[int]], queries: list[list[int]], partial: bool
) -> None:
    manager = make_manager(backend, make_config(TPB, slots=64, enable_partial_reuse=partial))
    build_tree(manager, sequences)
    check_accounting(manager, open_caches=False)
    probes = [(None, q) for q in queries]
    before = snapshot(manager, (), probes)
    for q in queries:
        # Nothing is evicted (64 slots), so full attention reuses the longest common prefix
        # (partial reuse) or the whole blocks of it plus an exact tail block, which is in the
        # tree unless a longer sequence extends it (docs/manager.md, "Reuse").
        best = max(common_prefix(s, q) for s in sequences)
        if partial:
            expected = best
        else:
            expected = best // TPB * TPB
            extended = any(len(s) > len(q) and s[: len(q)] == q for s in sequences)
            if len(q) % TPB and q in sequences and not extended and expected == len(q) // TPB * TPB:
                expected = len(q)
        assert manager.probe_reuse(None, q) == expected, q
        assert manager.probe_reuse(None, q) == expected, q
        cache = manager.create_kv_cache(None, q)
        assert cache.num_committed_tokens == expected
        assert list(cache.committed_tokens) == q[:expected]
        check_lengths(cache)
        cache.close()
        assert snapshot(manager, (), probes) == before


SCOPES = [None, ReuseScope(), ReuseScope(0, None), ReuseScope(None, 0), ReuseScope(0, 0), ReuseScope(1, None)]


def scope_class(scope: ReuseScope | None) -> ReuseScope:
    return ReuseScope() if scope is None else scope


@pytest.mark.parametrize("writer", range(len(SCOPES)), ids=[str(s) for s in SCOPES])
def test_scopes_never_share(backend: kv_api.Backend, writer: int) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    tokens = toks(8)
    committed(manager, tokens, scope=SCOPES[writer])
    for scope in SCOPES:
        expected = 8 if scope_class(scope) == scope_class(SCOPES[writer]) else 0
        assert manager.probe_reuse(scope, tokens) == expected, scope
        cache = manager.create_kv_cache(scope, tokens)
        assert cache.num_committed_tokens == expected, scope
        cache.close()


def test_each_scope_has_its_own_pages(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    scopes = [ReuseScope(), ReuseScope(0, None), ReuseScope(None, 0)]
    for scope in scopes:
        committed(manager, toks(8), scope=scope)
    assert manager.get_storage_statistics()[0].evictable == 2 * len(scopes)
    for scope in scopes:
        assert manager.probe_reuse(scope, toks(8)) == 8


#: Each field absent, 0 (not the same as absent), small, or the largest u64.
SCOPE_FIELDS = st.one_of(st.none(), st.sampled_from([0, 1, 2, 2**64 - 1]))
SCOPE_DRAWS = st.one_of(st.none(), st.builds(ReuseScope, SCOPE_FIELDS, SCOPE_FIELDS))


@pytest.mark.parametrize("key_format", kv_api.constants.KEY_FORMATS)
@given(writer=SCOPE_DRAWS, reader=SCOPE_DRAWS, tokens=st.lists(st.integers(0, 50), min_size=1, max_size=14))
def test_scope_isolation_property(
    backend: kv_api.Backend,
    key_format: str,
    writer: ReuseScope | None,
    reader: ReuseScope | None,
    tokens: list[int],
) -> None:
    """Under either key format, tokens committed under one scope are reused under it (whole) and
    never under another: the root key takes both fields, and None differs from 0."""
    manager = make_manager(backend, make_config(TPB, slots=16, key_format=key_format))
    committed(manager, tokens, scope=writer)
    expected = len(tokens) if scope_class(reader) == scope_class(writer) else 0
    assert manager.probe_reuse(writer, tokens) == len(tokens)
    assert manager.probe_reuse(reader, tokens) == expected
    cache = manager.create_kv_cache(reader, tokens)
    assert cache.num_committed_tokens == expected
    cache.close()


@pytest.mark.parametrize(
    ("query", "with_partial", "without"),
    [
        (toks(10), 10, 10),  # the partial tail block, exactly
        (toks(9), 9, 8),  # a prefix of the partial tail
        (toks(11), 10, 8),  # past the partial tail
        ([*toks(9), 50], 9, 8),  # diverges inside the partial tail
        (toks(6), 6, 4),  # a prefix of a full block
        ([*toks(5), 50, 51, 52], 5, 4),  # diverges inside a full block
        (toks(8), 8, 8),
        ([50, *toks(9)], 0, 0),
    ],
)
def test_partial_reuse(backend: kv_api.Backend, query: list[int], with_partial: int, without: int) -> None:
    for partial, expected in ((True, with_partial), (False, without)):
        manager = make_manager(backend, make_config(TPB, slots=16, enable_partial_reuse=partial))
        committed(manager, toks(10))  # blocks [0..3] [4..7] and the partial tail [8, 9]
        assert manager.probe_reuse(None, query) == expected, partial
        cache = manager.create_kv_cache(None, query)
        assert cache.num_committed_tokens == expected, partial
        assert cache.resume()
        check_lengths(cache)
        cache.close()


# Ids past 32 bits in the tree (sha256-u64): a block's tokens are compared whole, never by their
# low 32 bits (the native tree keeps a block's ids in 4 bytes only while all of them fit).
WIDE = [2**32 + 5, 6, 2**64 - 1, 8, 2**33, 10]  # a full block, then the tail [2**33, 10]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ([5, 6, 2**64 - 1, 8], 0),  # equal to the first block's ids but for bit 32
        ([2**32 + 5, 6, 7], 2),  # diverges inside the first block
        ([*WIDE[:4], 2**33], 5),  # inside the wide tail
        ([*WIDE[:4], 0], 4),  # 2**33's low 32 bits: no match
        ([*WIDE[:4], 2**33, 10], 6),
    ],
)
def test_partial_reuse_of_ids_past_32_bits(backend: kv_api.Backend, query: list[int], expected: int) -> None:
    events = backend.KVCacheEventManager(100, "v2_sha256")
    config = make_config(TPB, slots=4, enable_partial_reuse=True, key_format="sha256-u64")
    manager = make_manager(backend, config, event_manager=events)
    for round_ in range(3):  # narrow and wide blocks evicted and made again, in turns
        committed(manager, toks(8, 100 * round_))
        committed(manager, WIDE)
    check_reuse_and_announced(manager, events, query, expected, [WIDE[:4], WIDE[4:]])


def check_reuse_and_announced(
    manager: Any, events: Any, query: list[int], expected: int, last_stored: list[list[int]]
) -> None:
    """``query`` reuses ``expected`` tokens, probed and admitted; the last Stored event announced
    blocks of ``last_stored``'s tokens."""
    assert manager.probe_reuse(None, query) == expected
    cache = manager.create_kv_cache(None, query)
    assert cache.num_committed_tokens == expected
    cache.close()
    events.flush_iteration_events()
    stored = [e.data for e in events.get_latest_events(0) if isinstance(e.data, Stored)]
    assert [b.tokens for b in stored[-1].blocks] == [tuple(UniqueToken(t) for t in b) for b in last_stored]


# Blocks longer than the native tree keeps beside each block record (256 4-byte ids): a full
# one's ids live on the heap, a partial one's beside the record; both are matched, evicted, made
# again and announced whole.
BIG = 300


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ([*toks(BIG - 1, 7), 0], BIG - 1),  # diverges at the full block's last id
        ([*toks(BIG + 50, 7), 0], BIG + 50),  # inside the partial tail
        (toks(BIG + 100, 7), BIG + 100),
    ],
)
def test_partial_reuse_of_blocks_past_the_token_area(backend: kv_api.Backend, query: list[int], expected: int) -> None:
    events = backend.KVCacheEventManager(100, "v2_sha256")
    manager = make_manager(backend, make_config(BIG, slots=4, enable_partial_reuse=True), event_manager=events)
    prompt = toks(BIG + 100, 7)
    for round_ in range(3):  # big blocks evicted and made again, in turns with others
        committed(manager, toks(2 * BIG, 10_000 * (round_ + 1)))
        committed(manager, prompt)
    check_reuse_and_announced(manager, events, query, expected, [prompt[:BIG], prompt[BIG:]])


@pytest.mark.parametrize(
    ("backoff", "query_len", "expected"),
    [(0, 12, 12), (1, 12, 11), (3, 12, 9), (4, 12, 8), (5, 12, 7), (11, 12, 1), (12, 12, 0), (3, 2, 0), (3, 6, 3)],
)
def test_reuse_match_backoff(backend: kv_api.Backend, backoff: int, query_len: int, expected: int) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16, reuse_match_backoff=backoff))
    committed(manager, toks(12))
    query = toks(query_len)
    assert manager.probe_reuse(None, query) == expected
    cache = manager.create_kv_cache(None, query)
    assert cache.num_committed_tokens == expected
    cache.close()


@pytest.mark.parametrize("backoff", [4, 8])
def test_reuse_match_backoff_drops_whole_blocks(backend: kv_api.Backend, backoff: int) -> None:
    """A backoff that ends on a block boundary drops the blocks it covers: the cache holds none of
    their pages (they stay evictable), and its blocks match its length."""
    manager = make_manager(backend, make_config(TPB, slots=16, reuse_match_backoff=backoff))
    committed(manager, toks(12))  # three evictable pages
    cache = manager.create_kv_cache(None, toks(12))
    assert cache.num_committed_tokens == 12 - backoff
    check_lengths(cache)
    [stats] = manager.get_storage_statistics()
    assert (stats.free, stats.evictable) == (16 - 3, backoff // TPB)  # held pages are not evictable
    assert cache.resume()
    assert cache.get_base_page_indices(0).count(-1) == 0
    cache.close()


def test_a_back_off_of_exactly_the_last_block_drops_it(backend: kv_api.Backend) -> None:
    """``reuse_match_backoff`` equal to the matched tokens of the last block removes that block
    from the match: the new cache holds no page of it."""
    m = make_manager(backend, make_config(TPB, slots=8, reuse_match_backoff=TPB))
    committed(m, toks(2 * TPB))
    for n in (2 * TPB, 2 * TPB + 1):
        cache = m.create_kv_cache(None, toks(n))
        assert cache.num_reused_tokens == TPB
        assert cache.num_blocks == 1
        assert list(cache.get_page_levels(0)) == [0]
        assert m.get_storage_statistics() == [StorageStatistics(8, 6, 1)]  # the second block stays evictable
        cache.close()


def nth_key(scope: ReuseScope | None, tokens: list[int], block: int) -> bytes:
    keys = kv_api.keys.block_keys(TPB, scope, tokens)
    return keys[32 * (block + 1) : 32 * (block + 2)]  # the root key comes first


@pytest.mark.parametrize("scope", [None, ReuseScope(3, 4)])
def test_probe_first_new_block_key(backend: kv_api.Backend, scope: ReuseScope | None) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    # Empty tree: block 0 of the query, unless it is partial.
    assert manager.probe_first_new_block_key(scope, toks(6)) == nth_key(scope, toks(6), 0)
    assert manager.probe_first_new_block_key(scope, toks(3)) is None
    assert manager.probe_first_new_block_key(scope, []) is None
    committed(manager, toks(10), scope=scope)
    query = [*toks(8), *toks(8, 100), 7, 7]
    assert manager.probe_reuse(scope, query) == 8
    assert manager.probe_first_new_block_key(scope, query) == nth_key(scope, query, 2)
    # A partial match (9 tokens) still names block 2, computed over the query's own tokens.
    query = [*toks(9), 50, 51, 52, 53]
    assert manager.probe_reuse(scope, query) == 9
    assert manager.probe_first_new_block_key(scope, query) == nth_key(scope, query, 2)
    # The next block would be partial, or everything is reusable: None.
    assert manager.probe_first_new_block_key(scope, [*toks(8), 50, 51]) is None
    assert manager.probe_first_new_block_key(scope, toks(8)) is None
    assert manager.probe_first_new_block_key(scope, toks(10)) is None
    # Another scope sees an empty tree.
    other = ReuseScope(9, None)
    assert manager.probe_first_new_block_key(other, toks(8)) == nth_key(other, toks(8), 0)


def test_probe_names_a_block_that_ends_the_tokens(backend: kv_api.Backend) -> None:
    """The first new block may end exactly where the tokens end: it is complete, so it has a key."""
    manager = make_manager(backend, make_config(TPB, slots=16))
    raw = kv_api.keys.block_keys(TPB, None, toks(2 * TPB))
    assert manager.probe_first_new_block_key(None, toks(TPB)) == raw[32:64]
    assert manager.probe_first_new_block_key(None, toks(2 * TPB)) == raw[32:64]


def test_probe_first_new_block_key_changes_nothing(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=16))
    committed(manager, toks(8))
    probes = [(None, toks(8)), (None, toks(16))]
    before = snapshot(manager, (), probes)
    manager.probe_first_new_block_key(None, toks(16))
    assert snapshot(manager, (), probes) == before


WINDOW_REUSE = {
    # At endpoint H the window needs blocks from (H + 1 - 8) // 4 on, so 15 is reusable but
    # 14 is not; blocks 0 and 1 have no window page, so a cut falls back to nothing...
    None: {16: 16, 15: 15, 14: 0, 12: 0, 8: 0, 4: 0, 20: 16},
    # ... unless block 0 is a sink block (always kept): then a cut falls back to 4 tokens.
    4: {16: 16, 15: 15, 14: 4, 12: 4, 8: 4, 5: 4, 4: 4, 3: 3, 20: 16},
}


@pytest.mark.parametrize("sinks", WINDOW_REUSE.keys())
def test_window_reuses_only_where_window_pages_exist(backend: kv_api.Backend, sinks: int | None) -> None:
    """tpb 4, window 8: a cache whose history ran ahead never held window pages for its stale
    blocks, so only endpoints whose window needs none of them are reusable."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8, sinks=sinks))
    cache = manager.create_kv_cache()
    assert cache.resume()
    assert cache.resize(17, 16)  # block 1, and block 0 unless it is a sink, are stale at 16
    window = list(cache.get_base_page_indices(1))
    assert window[1] == -1
    assert (window[0] >= 0) == (sinks is not None)
    cache.commit(toks(16))
    cache.close()
    for length, reusable in WINDOW_REUSE[sinks].items():
        assert manager.probe_reuse(None, toks(length)) == reusable, length
        cache = manager.create_kv_cache(None, toks(length))
        assert cache.num_committed_tokens == reusable, length
        cache.close()


def test_rebase_onto_the_tree_page(backend: kv_api.Backend) -> None:
    """A full block committed while the tree already has it takes the tree's page; its own
    page is freed."""
    manager = make_manager(backend, make_config(TPB, slots=8))
    first = active(manager, 8, toks(4))
    second = active(manager, 8)
    tree_slot = first.get_base_page_indices(0)[0]
    own = second.get_base_page_indices(0)[0]
    free = manager.get_storage_statistics()[0].free
    second.commit(toks(4))
    assert second.get_base_page_indices(0)[0] == tree_slot != own
    assert manager.get_storage_statistics()[0].free == free + 1
    second.close()
    first.close()
    assert manager.probe_reuse(None, toks(4)) == 4
    check_accounting(manager, open_caches=False)


def test_window_pages_committed_in_flight_stay_reusable(backend: kv_api.Backend) -> None:
    """Committing block by block, each block's window page is committed before it goes stale:
    it stays in the tree (evictable), so every prefix is reusable."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    cache = active(manager, 17)
    for start in range(0, 16, TPB):
        cache.commit(toks(TPB, start))
    cache.close()
    for length in range(1, 17):
        assert manager.probe_reuse(None, toks(length)) == length


def test_stale_window_pages_are_held_until_committed(backend: kv_api.Backend) -> None:
    """Window pages that go stale before their block is committed stay held (not free, index -1)
    while the cache may still commit them; committed, they make every prefix reusable."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    cache = active(manager, 17)
    stats = manager.get_storage_statistics()
    assert cache.resize(None, 16)
    assert list(cache.get_base_page_indices(1))[:2] == [-1, -1]
    assert manager.get_storage_statistics() == stats
    cache.commit(toks(16))
    cache.close()
    for length in range(1, 17):
        assert manager.probe_reuse(None, toks(length)) == length


def test_a_commit_pending_window_page_is_released_when_committing_stops(backend: kv_api.Backend) -> None:
    """A stale window page kept for a commit (history ahead of the committed tokens) is freed once
    ``stop_committing`` makes that commit impossible."""
    m = backend.KVCacheManager(make_config(layers=[attention(0, GRAIN // 8, window=8)]))
    cache = active(m, 8)
    assert cache.resize(12, 11)  # block 0 turns stale before it is committed: kept for the commit
    assert list(cache.get_page_levels(0)) == [0, 0, 0]
    check_page_levels(m, cache)
    free = m.get_storage_statistics()[0].free
    cache.stop_committing()
    assert list(cache.get_page_levels(0)) == [-1, 0, 0]
    assert m.get_storage_statistics()[0].free == free + 1
    cache.close()
    check_accounting(m, open_caches=False)
