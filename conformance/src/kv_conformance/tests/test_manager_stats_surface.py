"""Sizing, statistics and reuse diagnostics (issue 12, item 5 without the auto-tuner; docs/manager.md,
"Sizing a batch: clamp_max_seq_len_for_mem" and "Statistics"): ``clamp_max_seq_len_for_mem``,
stats-excluded and dirty cache ids, per-request stats (``enable_request_stats``,
``expected_prompt_length``, ``text_only``), per-life-cycle, SSM-snapshot and peak-block iteration
stats, and ``probe_reuse_match``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    KVCacheManagerConfig,
    KVCacheStatsDelta,
    LifeCycleStats,
    ReuseMatch,
    SsmLayerConfig,
    SsmSnapshotStats,
)
from kv_api.constants import CACHE_ID_LIMIT, TOKEN_LIMIT, ceil_div
from kv_api.errors import InvalidStateError, LogicError

from ._manager import GRAIN, MIB, attention, hybrid_config, make_config, raises_exactly, snapshot, toks

DIGEST = bytes(range(32))
BAD_SCOPE: Any = "scope"  # not a ReuseScope


def one_group(tpb: int, slots: int, window: int | None, sinks: int | None = None) -> KVCacheManagerConfig:
    """Full attention plus (``window``) a window layer, one pool group of ``slots`` slots."""
    layers = [attention(0, GRAIN // slots)]
    if window is not None:
        layers.append(attention(1, GRAIN // slots, window, sinks))
    return make_config(tpb, layers=layers)


def ssm_hybrid(tpb: int = 4, window: int = 8, quota: int = 8 * MIB, **kwargs: Any) -> KVCacheManagerConfig:
    """Full attention (0), a window (1) and an SSM layer (2) in its own pool group."""
    kv = [BufferConfig("key", 4096), BufferConfig("value", 4096)]
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [
        AttentionLayerConfig(0, kv),
        AttentionLayerConfig(1, kv, window),
        SsmLayerConfig(2, [BufferConfig("state", 16384)]),
    ]
    return KVCacheManagerConfig(tpb, [GpuCacheTierConfig(quota)], layers, commit_min_snapshot=True, **kwargs)


# -- clamp_max_seq_len_for_mem -----------------------------------------------------------------------


def model_clamp(manager: kv_api.KVCacheManager, batch_size: int, bound: int) -> int:
    """The documented rule, step by step: the long request's need is the most it holds at any
    decode step (history h, capacity h + 1, h < L); each other request holds one slot per life
    cycle; every pool group must fit."""
    tpb = manager.tokens_per_block
    lcs = manager.life_cycles

    def need(lc: kv_api.LifeCycle, length: int) -> int:
        if lc.ssm:
            return 1
        most = 0
        for h in range(length):
            blocks = ceil_div(h + 1, tpb)
            begin, end = lc.get_stale_range(h)
            most = max(most, blocks - max(0, min(end, blocks) - min(begin, blocks)))
        return most

    best = 0
    for length in range(tpb, bound + 1, tpb):
        if all(
            sum(batch_size - 1 + need(lcs[lc], length) for lc in pg.life_cycles) <= pg.num_slots
            for pg in manager.pool_group_descs
        ):
            best = length
    return best


@pytest.mark.parametrize(
    ("batch_size", "bound", "expected"),
    [
        (1, 10**6, 8180),  # 2048 slots: L/4 full-attention blocks + the window's 3
        (100, 10**6, 7388),  # 99 one-token requests hold 2 slots each
        (1, 10, 8),  # block-aligned, at most the bound
        (1, 3, 0),  # no whole block below the bound
        (1, 0, 0),
        (1022, 10**6, 12),  # 2042 + 3 full + 3 window
        (1023, 10**6, 8),  # 2044 + 2 full + 2 window
        (1024, 10**6, 4),  # 2046 + 1 + 1
        (1025, 10**6, 0),  # the one-token requests alone fill the pool
    ],
)
def test_clamp_values(backend: kv_api.Backend, batch_size: int, bound: int, expected: int) -> None:
    m = backend.KVCacheManager(one_group(4, 2048, 8))
    assert m.pool_group_descs[0].num_slots == 2048
    assert m.clamp_max_seq_len_for_mem(batch_size, bound) == expected


def test_clamp_counts_the_window_peak_not_the_end(backend: kv_api.Backend) -> None:
    """tpb 32, window 64: a request of 128 tokens holds 2 window blocks at its last step but 3 at
    history 96 (capacity 97); the window's need is the peak, so with 3 + 4 slots a 128-token
    request fits and with 3 + 4 - 1 it does not (the full attention layer holding 4)."""
    for slots, expected in ((7, 128), (6, 96)):
        m = backend.KVCacheManager(one_group(32, slots, 64))
        assert m.clamp_max_seq_len_for_mem(1, 10**6 if slots == 6 else 128) == expected


@pytest.mark.requires("ssm_layers")
def test_clamp_ssm_needs_a_slot_per_request(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(ssm_hybrid())
    ssm_slots = next(pg.num_slots for pg in m.pool_group_descs if 2 in pg.life_cycles)
    attn_slots = next(pg.num_slots for pg in m.pool_group_descs if 0 in pg.life_cycles)
    assert m.clamp_max_seq_len_for_mem(ssm_slots, 10**9) > 0
    assert m.clamp_max_seq_len_for_mem(ssm_slots + 1, 10**9) == 0
    # Attention: (n - 1) * 2 + L/4 + window peak 3 <= attention slots.
    assert m.clamp_max_seq_len_for_mem(1, 10**9) == (attn_slots - 3) * 4
    assert m.clamp_max_seq_len_for_mem(2, 10**9) == (attn_slots - 5) * 4


def test_clamp_follows_a_quota_resize(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, slots=64))
    assert m.clamp_max_seq_len_for_mem(1, 10**6) == 64 * 4
    assert m.resize(0, 2 * GRAIN)
    assert m.clamp_max_seq_len_for_mem(1, 10**6) == 128 * 4
    assert m.clamp_max_seq_len_for_mem(2, 10**6) == 127 * 4


@pytest.mark.parametrize("window", [5, 8, 13])
def test_clamped_length_is_reachable_and_the_next_is_not(backend: kv_api.Backend, window: int) -> None:
    """Run it: batch_size - 1 one-token requests resumed, then one request decoding token by token
    (committing as it goes, so stale window pages become evictable) reaches the clamped length;
    one block more runs out of pages on the way."""
    tpb, slots, batch = 4, 16, 3
    for extra, ok in ((0, True), (tpb, False)):
        m = backend.KVCacheManager(one_group(tpb, slots, window))
        length = m.clamp_max_seq_len_for_mem(batch, 10**6)
        assert length == model_clamp(m, batch, 200)
        small = []
        for i in range(batch - 1):
            c = m.create_kv_cache(None, None, 1000 + i)
            assert c.resume() and c.resize(1)
            small.append(c)
        long = m.create_kv_cache()
        assert long.resume()
        reached = True
        for h in range(length + extra):
            if not long.resize(h + 1):
                reached = False
                break
            long.commit([h])
        assert reached is ok
        for c in [*small, long]:
            c.close()


@given(
    tpb=st.sampled_from([1, 2, 4, 8]),
    window=st.one_of(st.none(), st.integers(1, 40)),
    sinks=st.one_of(st.none(), st.integers(1, 9)),
    slots=st.integers(2, 64),
    batch=st.integers(1, 40),
    bound=st.integers(0, 120),
)
@settings(max_examples=60, deadline=None)
def test_clamp_property(
    backends: list[kv_api.Backend],
    tpb: int,
    window: int | None,
    sinks: int | None,
    slots: int,
    batch: int,
    bound: int,
) -> None:
    config = one_group(tpb, slots, window, sinks if window is not None else None)
    got = []
    for b in backends:
        m = b.KVCacheManager(config)
        got.append(m.clamp_max_seq_len_for_mem(batch, bound))
        assert got[-1] == model_clamp(m, batch, bound)
    assert len(set(got)) == 1


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((0, 10), ValueError, f"batch_size: must be in [1, {TOKEN_LIMIT}) (got 0)"),
        ((-1, 10), ValueError, f"batch_size: must be in [1, {TOKEN_LIMIT}) (got -1)"),
        ((TOKEN_LIMIT, 10), ValueError, f"batch_size: must be in [1, {TOKEN_LIMIT}) (got {TOKEN_LIMIT})"),
        ((1, -1), ValueError, f"token_upper_bound: must be in [0, {TOKEN_LIMIT}) (got -1)"),
        ((1, TOKEN_LIMIT), ValueError, f"token_upper_bound: must be in [0, {TOKEN_LIMIT}) (got {TOKEN_LIMIT})"),
        (("1", 10), TypeError, "batch_size: expected an int, got str"),
        ((True, 10), TypeError, "batch_size: expected an int, got bool"),
        ((None, 10), TypeError, "batch_size: expected an int, got NoneType"),
        ((1, 2.0), TypeError, "token_upper_bound: expected an int, got float"),
        ((0, "x"), ValueError, f"batch_size: must be in [1, {TOKEN_LIMIT}) (got 0)"),  # left to right
    ],
)
def test_clamp_bad_arguments(
    backends: list[kv_api.Backend], args: tuple[Any, Any], error: type[Exception], message: str
) -> None:
    for b in backends:
        m = b.KVCacheManager(make_config())
        before = snapshot(m)
        e = raises_exactly(error, partial(m.clamp_max_seq_len_for_mem, *args))
        assert str(e) == message
        assert snapshot(m) == before


def test_clamp_after_shutdown(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config())
    m.shutdown()
    raises_exactly(InvalidStateError, lambda: m.clamp_max_seq_len_for_mem(1, 8))


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


# -- SSM snapshots and peak blocks -----------------------------------------------------------------


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


# -- probe_reuse_match -----------------------------------------------------------------------------


@pytest.mark.requires("ssm_layers")
def test_reuse_match_diagnostics_hybrid(backend: kv_api.Backend) -> None:
    """Snapshots in block 1 (after 8 tokens) and in the partial tail [8, 9]: a prompt diverging
    after token 8 walks 9 tokens, attention keeps 9 (the tail's pages cover 2), the SSM state is
    only valid at 8."""
    m = backend.KVCacheManager(ssm_hybrid())
    w = m.create_kv_cache()
    assert w.resume() and w.resize(10)
    w.commit(toks(8))
    w.commit(toks(2, 8))
    w.close()
    assert m.probe_reuse_match(None, [*toks(9), 99]) == ReuseMatch(10, 9, 9, 8)
    assert m.probe_reuse_match(None, toks(12)) == ReuseMatch(12, 10, 10, 10)
    assert m.probe_reuse_match(None, toks(6)) == ReuseMatch(6, 6, 6, 0)  # no snapshot at 6
    assert m.probe_reuse_match() == ReuseMatch(0, 0, 0, 0)


def test_reuse_match_diagnostics_backoff(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, slots=16, reuse_match_backoff=3))
    c = m.create_kv_cache()
    assert c.resume() and c.resize(12)
    c.commit(toks(12))
    c.close()
    assert m.probe_reuse_match(None, toks(14)) == ReuseMatch(14, 12, 9, 9)
    assert m.probe_reuse(None, toks(14)) == 9


def test_reuse_match_bad_arguments(backends: list[kv_api.Backend]) -> None:
    for b in backends:
        m = b.KVCacheManager(make_config())
        e = raises_exactly(TypeError, partial(m.probe_reuse_match, BAD_SCOPE, [1]))
        assert str(e) == "reuse_scope: expected ReuseScope or None, got str"
        e = raises_exactly(ValueError, partial(m.probe_reuse_match, None, [-1]))
        assert str(e).startswith("token 0: id -1 out of range")
        m.shutdown()
        raises_exactly(InvalidStateError, partial(m.probe_reuse_match, None, [1]))


PROMPTS = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=18), min_size=1, max_size=5)


@pytest.mark.requires("ssm_layers")
@given(
    prompts=PROMPTS,
    chunks=st.lists(st.integers(1, 7), min_size=1, max_size=6),
    probes=st.lists(st.lists(st.integers(0, 2), max_size=20), min_size=1, max_size=6),
    backoff=st.integers(0, 5),
    window=st.integers(3, 12),
)
@settings(max_examples=40, deadline=None)
def test_reuse_match_order_property(
    backends: list[kv_api.Backend],
    prompts: list[list[int]],
    chunks: list[int],
    probes: list[list[int]],
    backoff: int,
    window: int,
) -> None:
    """reuse <= attention <= divergence <= lookup; reuse is probe_reuse; both backends agree."""
    results = []
    for b in backends:
        m = b.KVCacheManager(ssm_hybrid(window=window, reuse_match_backoff=backoff))
        for i, prompt in enumerate(prompts):
            c = m.create_kv_cache(None, prompt)
            assert c.resume() and c.resize(len(prompt))
            at, k = c.num_committed_tokens, 0
            while at < len(prompt):
                step = chunks[k % len(chunks)]
                c.commit(prompt[at : at + step], is_end=at + step >= len(prompt) and i % 2 == 0)
                at, k = at + step, k + 1
            c.close()
        got = []
        for probe in probes:
            r = m.probe_reuse_match(None, probe)
            assert r.num_reused_tokens <= r.num_attention_tokens <= r.num_divergence_tokens <= r.num_lookup_tokens
            assert r.num_lookup_tokens == len(probe)
            assert r.num_reused_tokens == m.probe_reuse(None, probe)
            got.append(r)
        results.append(got)
    assert all(r == results[0] for r in results)
