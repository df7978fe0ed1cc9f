"""Statistics (issue 12, item 5 without the auto-tuner; docs/manager.md, "Statistics"):
stats-excluded and dirty cache ids, per-request stats (``enable_request_stats``,
``expected_prompt_length``, ``text_only``; pending stats a discard empties), per-life-cycle,
SSM-snapshot (stored, skipped and reused, added up until read), iteration (every counter, since
the last call) and peak-block stats. Sizing a batch is in test_manager_clamp.py,
``probe_reuse_match`` in test_manager_reuse_match.py.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

import kv_api
from kv_api import (
    KVCacheStatsDelta,
    LifeCycleStats,
    SsmSnapshotStats,
)
from kv_api.constants import CACHE_ID_LIMIT, TOKEN_LIMIT
from kv_api.errors import LogicError

from ._manager import (
    GRAIN,
    active,
    attention,
    committed,
    hybrid_config,
    make_config,
    make_manager,
    raises_exactly,
    snapshot,
    ssm_hybrid,
    toks,
)

TPB = 4
DIGEST = bytes(range(32))


# -- per-request stats -----------------------------------------------------------------------------


def scenario(backend: kv_api.Backend) -> tuple[kv_api.KVCacheManager, list[Any]]:
    """Full attention + window 8, tpb 4: a request of 10 prompt tokens (expected prompt 8) growing
    to 16, committing 10; a second one reusing 8 of its tokens; the second closes first."""
    m = backend.KVCacheManager(hybrid_config(4, 64, 8))
    seen: list[Any] = []
    a = m.create_kv_cache(None, toks(10), 7, None, 8, None, True)
    seen.append((a.expected_prompt_length, a.text_only, m.get_dirty_stats_kv_cache_ids()))
    assert a.resume() and a.resize(16)
    a.commit(toks(10))
    seen.append(a.commit_pending_stats())
    seen.append(m.get_dirty_stats_kv_cache_ids())
    a.close()  # commits the partial tail: one more block
    seen.append(m.get_dirty_stats_kv_cache_ids())
    seen.append(a.commit_pending_stats())  # a closed cache still reports
    b = m.create_kv_cache(None, toks(12), None, None, None, None, True)
    seen.append((b.id, b.num_committed_tokens, b.expected_prompt_length))
    assert b.resume() and b.resize(13)
    seen.append(b.commit_pending_stats())
    b.discard_pending_stats()
    seen.append(m.get_dirty_stats_kv_cache_ids())
    b.close()
    seen.append(m.get_committed_stats())
    seen.append(m.get_and_reset_iteration_stats_by_life_cycle())
    seen.append(m.get_and_reset_iteration_stats_by_life_cycle())
    return m, seen


def test_request_stats_scenario(backend: kv_api.Backend) -> None:
    _, seen = scenario(backend)
    assert seen[0] == (8, False, [7])  # lookup tokens make it dirty at once
    # 4 blocks x 2 life cycles; blocks 2 and 3 start at or past the expected prompt (8).
    assert seen[1] == KVCacheStatsDelta(10, 0, 8, 4, 2)
    assert seen[2] == []
    assert seen[3] == [7]
    assert seen[4] == KVCacheStatsDelta(0, 0, 0, 0, 1)
    # The second reuses the partial tail too (10 tokens), so its partial block is copied: a
    # private page per life cycle, then block 3 (tokens 12..13) in both.
    assert seen[5] == (8, 10, 12)
    assert seen[6] == KVCacheStatsDelta(12, 10, 4, 2, 0)
    assert seen[7] == []
    stats = seen[8]
    assert (stats.requests, stats.lookup_tokens, stats.reused_tokens) == (2, 22, 10)
    assert (stats.allocated_pages, stats.committed_blocks) == (12, 3)
    # Pages per life cycle: 4 + 2 allocated; committed: blocks 0, 1 and the partial tail.
    assert seen[9] == {0: LifeCycleStats(6, 3), 1: LifeCycleStats(6, 3)}
    assert seen[10] == {0: LifeCycleStats(), 1: LifeCycleStats()}


def test_request_stats_same_on_both_backends(backends: list[kv_api.Backend]) -> None:
    results = [scenario(b)[1] for b in backends]
    assert all(r == results[0] for r in results)


def test_request_stats_need_enabling(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config())
    c = m.create_kv_cache(None, toks(5))
    e = raises_exactly(LogicError, c.commit_pending_stats)
    assert str(e) == "commit_pending_stats() needs a KV cache created with enable_request_stats=True"
    e = raises_exactly(LogicError, c.discard_pending_stats)
    assert str(e) == "discard_pending_stats() needs a KV cache created with enable_request_stats=True"
    assert m.get_dirty_stats_kv_cache_ids() == []
    assert c.expected_prompt_length == 5 and c.text_only is False


def test_discard_empties_the_pending_stats(backend: kv_api.Backend) -> None:
    """Full attention + window 8, tpb 4, 64 slots. Pending stats discarded: the cache is no
    longer dirty, a commit right after reports nothing, and what it does next counts from 0."""
    m = backend.KVCacheManager(hybrid_config(4, 64, 8))
    c = m.create_kv_cache(None, toks(6), 5, None, None, None, True)
    assert c.resume() and c.resize(8)
    assert m.get_dirty_stats_kv_cache_ids() == [5]
    c.discard_pending_stats()
    assert m.get_dirty_stats_kv_cache_ids() == []
    assert c.commit_pending_stats() == KVCacheStatsDelta()
    assert c.resize(12)  # block 2 in both life cycles, past the expected prompt (6)
    assert m.get_dirty_stats_kv_cache_ids() == [5]
    c.discard_pending_stats()
    assert c.resize(16)  # block 3 in both life cycles
    assert c.commit_pending_stats() == KVCacheStatsDelta(0, 0, 2, 2, 0)
    assert m.get_dirty_stats_kv_cache_ids() == []
    c.close()


def test_excluded_caches_feed_no_manager_stats(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid_config(4, 64, 8))
    m.mark_stats_excluded(3)
    assert m.is_stats_excluded(3) and not m.is_stats_excluded(4)
    c = m.create_kv_cache(None, toks(6), 3, None, None, None, True)
    assert c.resume() and c.resize(8)
    c.commit(toks(8))
    c.close()
    stats = m.get_and_reset_iteration_stats()
    assert (stats.requests, stats.lookup_tokens, stats.allocated_pages, stats.committed_blocks) == (0, 0, 0, 0)
    assert m.get_and_reset_iteration_stats_by_life_cycle() == {0: LifeCycleStats(), 1: LifeCycleStats()}
    assert c.commit_pending_stats() == KVCacheStatsDelta(6, 0, 4, 0, 2)  # its own stats still count
    # Marked while open: what it does afterwards is not counted, what it did before stays.
    d = m.create_kv_cache(None, toks(4), 9)
    assert d.resume() and d.resize(4)
    m.mark_stats_excluded(9)
    assert d.resize(12)
    d.close()
    stats = m.get_and_reset_iteration_stats()
    assert (stats.requests, stats.lookup_tokens, stats.reused_tokens, stats.allocated_pages) == (1, 4, 4, 0)


def test_excluding_one_open_cache_leaves_the_others_counted(backend: kv_api.Backend) -> None:
    m = make_manager(backend, make_config(TPB, slots=16))
    a = m.create_kv_cache(None, [], 9)
    b = m.create_kv_cache(None, [], 10)
    assert a.resume() and b.resume()
    m.get_and_reset_iteration_stats()
    m.mark_stats_excluded(9)
    assert a.resize(2 * TPB) and b.resize(3 * TPB)
    assert m.get_and_reset_iteration_stats().allocated_pages == 3  # b's, not a's
    a.close()
    b.close()


def test_dirty_ids(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config())
    for i in (5, 2, 9, 2):
        m.mark_stats_dirty(i)
    assert m.get_dirty_stats_kv_cache_ids() == [2, 5, 9]
    m.clear_stats_dirty(5)
    m.clear_stats_dirty(123)  # absent: nothing happens
    assert m.get_dirty_stats_kv_cache_ids() == [2, 9]
    c = m.create_kv_cache(None, None, 4, None, None, None, True)  # nothing pending yet
    assert m.get_dirty_stats_kv_cache_ids() == [2, 9]
    assert c.resume() and c.resize(1)
    assert m.get_dirty_stats_kv_cache_ids() == [2, 4, 9]
    m.clear_stats_dirty(4)  # the pending stats stay
    assert c.commit_pending_stats() == KVCacheStatsDelta(0, 0, 1, 1, 0)
    c.close()


@pytest.mark.parametrize(
    "method", ["mark_stats_excluded", "is_stats_excluded", "mark_stats_dirty", "clear_stats_dirty"]
)
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, f"cache_id: must be in [0, {CACHE_ID_LIMIT}) (got -1)"),
        (CACHE_ID_LIMIT, ValueError, f"cache_id: must be in [0, {CACHE_ID_LIMIT}) (got {CACHE_ID_LIMIT})"),
        ("3", TypeError, "cache_id: expected an int, got str"),
        (True, TypeError, "cache_id: expected an int, got bool"),
        (None, TypeError, "cache_id: expected an int, got NoneType"),
    ],
)
def test_cache_id_arguments(
    backends: list[kv_api.Backend], method: str, value: Any, error: type[Exception], message: str
) -> None:
    for b in backends:
        m = b.KVCacheManager(make_config())
        e = raises_exactly(error, partial(getattr(m, method), value))
        assert str(e) == message
        assert m.get_dirty_stats_kv_cache_ids() == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"expected_prompt_length": -1}, ValueError, f"expected_prompt_length: must be in [0, {TOKEN_LIMIT}) (got -1)"),
        ({"expected_prompt_length": "4"}, TypeError, "expected_prompt_length: expected an int, got str"),
        ({"expected_prompt_length": True}, TypeError, "expected_prompt_length: expected an int, got bool"),
        ({"text_only": 1}, TypeError, "text_only: expected a bool or None, got int"),
        ({"enable_request_stats": None}, TypeError, "enable_request_stats: expected a bool, got NoneType"),
        ({"enable_request_stats": 1}, TypeError, "enable_request_stats: expected a bool, got int"),
        (  # left to right
            {"id": -1, "text_only": 1},
            ValueError,
            f"id: must be in [0, {CACHE_ID_LIMIT}) (got -1)",
        ),
        ({"text_only": 1, "enable_request_stats": 1}, TypeError, "text_only: expected a bool or None, got int"),
        (
            {"input_tokens": [1, 2, DIGEST], "text_only": True},
            ValueError,
            "input_tokens: token 2 is a multimodal digest, which a text_only KV cache refuses",
        ),
    ],
)
def test_create_kv_cache_new_arguments(
    backends: list[kv_api.Backend], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    for b in backends:
        m = b.KVCacheManager(make_config())
        before = snapshot(m)
        e = raises_exactly(error, partial(m.create_kv_cache, **kwargs))
        assert str(e) == message
        assert snapshot(m) == before
        assert m.num_open_kv_caches == 0
        assert m.get_committed_stats().requests == 0
        assert m.create_kv_cache().id == 0  # no id was used up


def test_text_only(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(text_only=True))
    e = raises_exactly(ValueError, lambda: m.create_kv_cache(None, [DIGEST, 1]))
    assert str(e) == "input_tokens: token 0 is a multimodal digest, which a text_only KV cache refuses"
    mm = m.create_kv_cache(None, [DIGEST, 1], None, None, None, False)  # the cache's choice wins
    assert mm.text_only is False
    c = m.create_kv_cache(None, [1, 2])
    assert c.text_only is True
    assert c.resume() and c.resize(4)
    e = raises_exactly(ValueError, lambda: c.commit([5, 6, DIGEST]))
    assert str(e) == "tokens: token 2 is a multimodal digest, which a text_only KV cache refuses"
    assert c.num_committed_tokens == 0 and c.history_length == 0
    c.commit([5, 6, 7])
    assert c.committed_tokens == [5, 6, 7]
    assert mm.resume() and mm.resize(3)
    mm.commit([DIGEST, 1, 2])
    mm.close()
    c.close()


# -- SSM snapshots, iteration stats and peak blocks -------------------------------------------------


def ssm_scenario(backend: kv_api.Backend) -> list[Any]:
    m = backend.KVCacheManager(ssm_hybrid())
    out: list[Any] = []
    w = m.create_kv_cache()
    assert w.resume() and w.resize(10)
    w.commit(toks(8))  # a whole last block: its state is copied there
    out.append(m.get_and_reset_ssm_snapshot_iteration_stats())
    w.commit(toks(2, 8))  # a partial tail: its 2 attention pages and the state
    out.append(m.get_and_reset_ssm_snapshot_iteration_stats())
    w.close()
    r = m.create_kv_cache(None, toks(12))
    out.append((r.num_committed_tokens, m.get_and_reset_ssm_snapshot_iteration_stats()))
    r.close()
    n = m.create_kv_cache(None, [99])
    out.append((n.num_committed_tokens, m.get_and_reset_ssm_snapshot_iteration_stats()))
    n.close()
    out.append(m.get_and_reset_iteration_stats_by_life_cycle())
    return out


@pytest.mark.requires("ssm_layers")
def test_ssm_snapshot_stats(backend: kv_api.Backend) -> None:
    out = ssm_scenario(backend)
    assert out[0] == SsmSnapshotStats(1, 0, 0)
    assert out[1] == SsmSnapshotStats(1, 0, 0)
    assert out[2] == (10, SsmSnapshotStats(0, 0, 1))
    assert out[3] == (0, SsmSnapshotStats())
    # Allocated: 3 blocks x 2 attention life cycles, 1 state. Committed: blocks 0, 1 and the
    # partial tail in each attention life cycle, and 2 SSM snapshots.
    assert out[4] == {0: LifeCycleStats(3, 3), 1: LifeCycleStats(3, 3), 2: LifeCycleStats(1, 2)}


@pytest.mark.requires("ssm_layers")
def test_ssm_snapshot_stats_same_on_both_backends(backends: list[kv_api.Backend]) -> None:
    results = [ssm_scenario(b) for b in backends]
    assert all(r == results[0] for r in results)


def ssm_slots_all_live(backend: kv_api.Backend) -> tuple[Any, list[Any]]:
    """A hybrid manager with a resumed cache of 4 tokens per SSM slot, and those caches: every
    slot holds a live state (no resume headroom), so a snapshot copy finds no room."""
    m = backend.KVCacheManager(ssm_hybrid(max_util_for_resume=1.0))
    ssm_slots = next(pg.num_slots for pg in m.pool_group_descs if 2 in pg.life_cycles)
    caches = [m.create_kv_cache() for _ in range(ssm_slots)]
    for c in caches:
        assert c.resume() and c.resize(4)
    return m, caches


@pytest.mark.requires("ssm_layers")
def test_ssm_snapshot_skipped_without_room(backend: kv_api.Backend) -> None:
    """Every SSM slot holds a live state (no resume headroom): a commit's snapshot copy finds no
    room, the tokens are committed and the snapshot is counted as skipped."""
    m, caches = ssm_slots_all_live(backend)
    caches[0].commit(toks(4))
    assert caches[0].num_committed_tokens == 4
    assert m.get_and_reset_ssm_snapshot_iteration_stats() == SsmSnapshotStats(0, 1, 0)
    assert m.probe_reuse(None, toks(4)) == 0  # no snapshot: nothing reusable
    caches[1].close()  # a state slot comes free: the next commit's snapshot is stored
    caches[2].commit(toks(4, 100))
    assert m.get_and_reset_ssm_snapshot_iteration_stats() == SsmSnapshotStats(1, 0, 0)
    assert m.probe_reuse(None, toks(4, 100)) == 4
    for c in caches:
        c.close()


@pytest.mark.requires("ssm_layers")
def test_ssm_snapshots_stored_and_reused_add_up(backend: kv_api.Backend) -> None:
    """Two commits of whole blocks store two snapshots; two caches created on the committed
    prompt each reuse one, and a cache reusing nothing in between takes nothing away."""
    m = backend.KVCacheManager(ssm_hybrid())
    w = m.create_kv_cache()
    assert w.resume() and w.resize(8)
    w.commit(toks(4))
    w.commit(toks(4, 4))
    assert m.get_and_reset_ssm_snapshot_iteration_stats() == SsmSnapshotStats(2, 0, 0)
    w.close()
    m.get_and_reset_ssm_snapshot_iteration_stats()
    readers = [m.create_kv_cache(None, toks(8)) for _ in range(2)]
    other = m.create_kv_cache(None, [99])
    assert [r.num_committed_tokens for r in readers] == [8, 8] and other.num_committed_tokens == 0
    assert m.get_and_reset_ssm_snapshot_iteration_stats() == SsmSnapshotStats(0, 0, 2)
    for c in [*readers, other]:
        c.close()


@pytest.mark.requires("ssm_layers")
def test_ssm_snapshots_skipped_add_up(backend: kv_api.Backend) -> None:
    """Every SSM slot holds a live state (no resume headroom): two commits each skip their
    snapshot copy, and both are counted."""
    m, caches = ssm_slots_all_live(backend)
    caches[0].commit(toks(4))
    caches[1].commit(toks(4, 100))
    assert m.get_and_reset_ssm_snapshot_iteration_stats() == SsmSnapshotStats(0, 2, 0)
    assert m.get_and_reset_ssm_snapshot_iteration_stats() == SsmSnapshotStats()
    for c in caches:
        c.close()


@pytest.mark.requires("host_tier")
def test_iteration_stats_count_since_the_last_call(backend: kv_api.Backend) -> None:
    """``get_and_reset_iteration_stats`` counts what happened since the previous call, every
    counter (evicted and onboarded pages too), and starts afresh; the committed stats keep
    counting."""
    config = kv_api.KVCacheManagerConfig(
        tokens_per_block=4,
        cache_tiers=[kv_api.GpuCacheTierConfig(GRAIN), kv_api.HostCacheTierConfig(GRAIN // 2)],
        layers=[attention(0, GRAIN // 8)],
    )
    m = backend.KVCacheManager(config)
    assert m.get_and_reset_iteration_stats() == kv_api.CacheStats()
    committed(m, toks(8))  # 1 request, 2 pages, 2 blocks
    first = m.get_and_reset_iteration_stats()
    assert first == kv_api.CacheStats(requests=1, allocated_pages=2, committed_blocks=2)
    assert m.get_and_reset_iteration_stats() == kv_api.CacheStats()
    big = active(m, 8 * 4)  # the device's 8 slots: the two committed pages fall to the host
    big.close()
    reader = m.create_kv_cache(None, toks(8))
    assert reader.resume()  # both come back
    reader.close()
    second = m.get_and_reset_iteration_stats()
    assert second == kv_api.CacheStats(
        requests=2, lookup_tokens=8, reused_tokens=8, allocated_pages=8, evicted_pages=2, onboarded_pages=2
    )
    assert m.get_committed_stats() == kv_api.CacheStats(
        requests=3,
        lookup_tokens=8,
        reused_tokens=8,
        allocated_pages=10,
        evicted_pages=2,
        committed_blocks=2,
        onboarded_pages=2,
    )
    assert m.get_and_reset_iteration_stats() == kv_api.CacheStats()


def test_peak_block_stats(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, slots=16))
    assert m.get_and_reset_iteration_peak_block_stats() == [0]
    a = m.create_kv_cache()
    assert a.resume() and a.resize(24)  # 6 slots
    b = m.create_kv_cache()
    assert b.resume() and b.resize(8)  # 2 more
    b.close()  # nothing committed: freed
    assert m.get_and_reset_iteration_peak_block_stats(0) == [8]
    assert m.get_and_reset_iteration_peak_block_stats(0) == [6]  # from what is in use now
    a.commit(toks(8))
    a.close()  # two committed pages stay in the tree (in use, evictable)
    assert m.get_and_reset_iteration_peak_block_stats() == [6]
    assert m.get_and_reset_iteration_peak_block_stats() == [2]


@pytest.mark.parametrize(
    ("level", "error", "message"),
    [
        (1, IndexError, "level 1 out of range (0..0)"),
        (-1, ValueError, "level: must be >= 0 (got -1)"),
        ("0", TypeError, "level: expected an int, got str"),
    ],
)
def test_peak_block_stats_bad_level(
    backends: list[kv_api.Backend], level: Any, error: type[Exception], message: str
) -> None:
    for b in backends:
        m = b.KVCacheManager(make_config())
        e = raises_exactly(error, partial(m.get_and_reset_iteration_peak_block_stats, level))
        assert str(e) == message
