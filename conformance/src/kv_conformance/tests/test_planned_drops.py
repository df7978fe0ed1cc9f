"""Planned drops (behaviour-spec §2, ``plan_committed_block_drop`` and ``PlannedDropHandle``;
docs/manager.md, "Planned drops"): after ``stop_committing()`` a cache plans to drop the tree
pages only its exact continuation would reuse, the trailing window pages and the last block's SSM
snapshot, never full attention nor sinks. Each page counts its plans; ``drop()`` (once) or the
handle's release withdraws one, and a page left with none that nobody holds goes at once; a
page evicted meanwhile is skipped, the plan's later pages still go.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

import kv_api
from kv_api import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, KVCacheManagerConfig, SsmLayerConfig
from kv_api.errors import LogicError
from kv_api.events import Removed

from ._manager import (
    GRAIN,
    MIB,
    active,
    attention,
    check_accounting,
    fails_atomically,
    hybrid_config,
    make_config,
    make_manager,
    raises_exactly,
    toks,
)
from .test_hybrid_snapshots import hybrid

FULL, WINDOW = 0, 1  # layer groups of ``hybrid_config``
TPB = 4


def removed(events: kv_api.KVCacheEventManager) -> list[tuple[int | None, int]]:
    """(layer group, blocks) of each Removed event since the last call."""
    events.flush_iteration_events()
    out = [
        (e.layer_group_id, len(e.data.block_hashes)) for e in events.get_latest_events() if isinstance(e.data, Removed)
    ]
    events.get_latest_events()  # drained
    return out


def used(manager: kv_api.KVCacheManager) -> list[tuple[int, int]]:
    """(free, evictable) per pool group of the device level."""
    return [(s.free, s.evictable) for s in manager.get_storage_statistics()]


def finished(manager: kv_api.KVCacheManager, tokens: list[int], close: bool = True) -> kv_api.KVCache:
    """A request that committed ``tokens`` (after what it reused) and stopped; closed if ``close``."""
    cache = manager.create_kv_cache(None, tokens)
    assert cache.resume()
    assert cache.resize(len(tokens))
    cache.commit(tokens[cache.num_committed_tokens :], is_end=True)
    if close:
        cache.close()
    return cache


def window_manager(backend: kv_api.Backend, **kwargs: Any) -> tuple[kv_api.KVCacheManager, kv_api.KVCacheEventManager]:
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    return backend.KVCacheManager(hybrid_config(tokens_per_block=4, slots=32, window=8, **kwargs), events), events


# -- planning -------------------------------------------------------------------------------------


def test_planning_requires_stop_committing(backend: kv_api.Backend) -> None:
    m, _ = window_manager(backend)
    c = m.create_kv_cache(None, [])
    assert c.resume() and c.resize(20)
    c.commit(toks(20))
    error = raises_exactly(LogicError, c.plan_committed_block_drop)
    assert "stop_committing" in str(error)
    fails_atomically(m, [c], c.plan_committed_block_drop, LogicError, probes=[(None, toks(20))])
    c.stop_committing()
    assert isinstance(c.plan_committed_block_drop(), kv_api.PlannedDropHandle)
    c.close()
    # commit(is_end=True) stops committing too, and a closed cache has stopped.
    assert isinstance(c.plan_committed_block_drop(), kv_api.PlannedDropHandle)
    assert finished(m, toks(8, 100), close=False).plan_committed_block_drop() is not None


def test_plan_committed_block_drop_before_stop_committing_message(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    cache = active(manager, 8, toks(6))
    err = raises_exactly(LogicError, cache.plan_committed_block_drop)
    assert str(err) == "plan_committed_block_drop() requires stop_committing()"
    cache.close()


def test_nothing_committed_plans_nothing(backend: kv_api.Backend) -> None:
    m, _ = window_manager(backend)
    c = m.create_kv_cache(None, [])
    c.stop_committing()
    assert c.plan_committed_block_drop() is None
    c.close()


def test_committed_tokens_no_longer_reusable_plan_nothing(backend: kv_api.Backend) -> None:
    m, _ = window_manager(backend)
    c = finished(m, toks(20))
    m.clear_reusable_blocks()
    assert c.plan_committed_block_drop() is None
    # Partially reusable is not enough either: the window pages of the tail are gone.
    c = finished(m, toks(20))
    handle = c.plan_committed_block_drop()
    assert handle is not None
    handle.drop()
    assert m.probe_reuse(None, toks(20)) == 12
    assert c.plan_committed_block_drop() is None


def test_the_rematch_ignores_reuse_match_backoff(backend: kv_api.Backend) -> None:
    m, events = window_manager(backend, reuse_match_backoff=1)
    c = finished(m, toks(20))
    assert m.probe_reuse(None, toks(20)) == 19
    handle = c.plan_committed_block_drop()
    assert handle is not None
    removed(events)
    handle.drop()
    assert removed(events) == [(WINDOW, 2)]


# -- what a drop drops ---------------------------------------------------------------------------


def test_window_pages_past_the_stale_range_are_dropped(backend: kv_api.Backend) -> None:
    """tpb 4, window 8, 20 tokens: the stale range at 20 ends at block (21 - 8) // 4 = 3, so the
    window pages of blocks 3 and 4 go; full attention and the older window pages stay."""
    m, events = window_manager(backend)
    c = finished(m, toks(20))
    before = used(m)
    assert before == [(22, 10)]  # 5 blocks, full attention and window
    handle = c.plan_committed_block_drop()
    assert handle is not None
    assert used(m) == before  # planning changes nothing
    removed(events)
    handle.drop()
    assert removed(events) == [(WINDOW, 2)]
    assert used(m) == [(24, 8)]
    assert m.probe_reuse(None, toks(20)) == 12  # the last endpoint whose window is whole
    assert m.probe_reuse(None, toks(12)) == 12
    # Full attention is whole: a request re-prefilling the window reuses nothing less.
    r = m.create_kv_cache(None, toks(20))
    assert r.num_reused_tokens == 12
    r.close()
    check_accounting(m, open_caches=False)


@pytest.mark.requires("ssm_layers")
def test_commit_min_snapshot_window_spec_vector(backend: kv_api.Backend) -> None:
    """The spec's vector (tpb 32, window 64, 128 tokens: window tree pages [None, None, p, p]):
    both window pages are planned, and once they go 128 tokens reuse nothing."""
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    m = backend.KVCacheManager(hybrid(ssm=False), events)
    c = finished(m, toks(128))
    assert m.probe_reuse(None, toks(128)) == 128
    handle = c.plan_committed_block_drop()
    assert handle is not None
    removed(events)
    before = used(m)
    handle.drop()
    assert removed(events) == [(WINDOW, 2)]
    assert used(m) == [(before[0][0] + 2, before[0][1] - 2)]
    assert m.probe_reuse(None, toks(128)) == 0
    check_accounting(m, open_caches=False)


def ssm_config(tpb: int = 32) -> KVCacheManagerConfig:
    """Full attention and an SSM layer (its own pool group), with ``commit_min_snapshot``."""
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [
        AttentionLayerConfig(0, [BufferConfig("key", 4096), BufferConfig("value", 4096)]),
        SsmLayerConfig(1, [BufferConfig("state", 16384)]),
    ]
    return KVCacheManagerConfig(tpb, [GpuCacheTierConfig(8 * MIB)], layers, commit_min_snapshot=True)


@pytest.mark.requires("ssm_layers")
def test_the_last_ssm_snapshot_is_dropped(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    m = backend.KVCacheManager(ssm_config(), events)
    c = m.create_kv_cache(None, [])
    assert c.resume() and c.resize(70)
    c.commit(toks(64))  # a snapshot ending block 1
    c.commit(toks(6, 64), is_end=True)  # and one at 70, in block 2
    c.close()
    assert m.probe_reuse(None, toks(70)) == 70
    removed(events)
    before = used(m)
    handle = c.plan_committed_block_drop()
    assert handle is not None
    handle.drop()
    assert removed(events) == [(1, 1)]
    assert used(m) == [before[0], (before[1][0] + 1, before[1][1] - 1)]
    # The snapshot at 64 and every full-attention page stay.
    assert m.probe_reuse(None, toks(70)) == 64
    check_accounting(m, open_caches=False)


@pytest.mark.requires("ssm_layers")
def test_hybrid_window_and_ssm(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    m = backend.KVCacheManager(hybrid(), events)
    c = finished(m, toks(70))
    assert m.probe_reuse(None, toks(70)) == 70
    handle = c.plan_committed_block_drop()
    assert handle is not None
    removed(events)
    handle.drop()
    # The stale range at 70 ends at block (71 - 64) // 32 = 0: every window page, and the
    # snapshot of block 2, go.
    got = removed(events)
    assert sorted(got) == [(1, 3), (2, 1)]
    assert m.probe_reuse(None, toks(70)) == 0
    check_accounting(m, open_caches=False)


def test_full_attention_is_never_dropped(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    m = backend.KVCacheManager(make_config(slots=16), events)
    c = finished(m, toks(14))
    handle = c.plan_committed_block_drop()
    assert handle is not None  # it covers nothing
    removed(events)
    before = used(m)
    handle.drop()
    assert removed(events) == []
    assert used(m) == before
    assert m.probe_reuse(None, toks(14)) == 14


def test_sink_blocks_are_never_dropped(backend: kv_api.Backend) -> None:
    m, events = window_manager(backend, sinks=4)
    c = finished(m, toks(6))  # 2 blocks: the sink block, and one inside the window
    handle = c.plan_committed_block_drop()
    assert handle is not None
    removed(events)
    handle.drop()
    assert removed(events) == [(WINDOW, 1)]
    assert m.probe_reuse(None, toks(4)) == 4  # the sink block stays


# -- when a drop drops --------------------------------------------------------------------------


def test_a_held_page_is_not_dropped(backend: kv_api.Backend) -> None:
    """The drop applies to pages droppable at the time: one a cache still holds stays in the tree
    (and is later evicted as any other page)."""
    m, events = window_manager(backend)
    c = finished(m, toks(20), close=False)
    handle = c.plan_committed_block_drop()
    assert handle is not None
    removed(events)
    handle.drop()
    assert removed(events) == []
    c.close()
    assert removed(events) == []
    assert m.probe_reuse(None, toks(20)) == 20
    assert used(m) == [(22, 10)]


def test_every_plan_on_a_page_must_drop(backend: kv_api.Backend) -> None:
    m, events = window_manager(backend)
    c = finished(m, toks(20))
    first, second = c.plan_committed_block_drop(), c.plan_committed_block_drop()
    # A reader finishing the same tokens plans the same pages.
    third = finished(m, toks(20)).plan_committed_block_drop()
    assert first is not None and second is not None and third is not None
    removed(events)
    first.drop()
    second.drop()
    assert removed(events) == []
    assert m.probe_reuse(None, toks(20)) == 20
    third.drop()
    assert removed(events) == [(WINDOW, 2)]
    assert m.probe_reuse(None, toks(20)) == 12


def test_a_second_drop_raises(backend: kv_api.Backend) -> None:
    m, _ = window_manager(backend)
    handle = finished(m, toks(20)).plan_committed_block_drop()
    assert handle is not None
    handle.drop()
    error = raises_exactly(LogicError, handle.drop)
    assert "already been dropped" in str(error)
    fails_atomically(m, [], handle.drop, LogicError, probes=[(None, toks(20)), (None, toks(12))])


def test_a_second_drop_names_the_handle(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(make_config(4, layers=[attention(0, GRAIN // 32), attention(1, GRAIN // 32, 8)]))
    c = m.create_kv_cache(None, [])
    assert c.resume() and c.resize(20)
    c.commit(toks(20), is_end=True)
    handle = c.plan_committed_block_drop()
    assert handle is not None
    handle.drop()
    error = raises_exactly(LogicError, handle.drop)
    assert str(error) == "Planned drop handle has already been dropped"
    c.close()


def test_releasing_the_handle_drops(backend: kv_api.Backend) -> None:
    m, events = window_manager(backend)
    handle = finished(m, toks(20)).plan_committed_block_drop()
    removed(events)
    del handle
    gc.collect()
    assert removed(events) == [(WINDOW, 2)]
    assert m.probe_reuse(None, toks(20)) == 12


def test_a_with_block_drops_at_its_end(backend: kv_api.Backend) -> None:
    m, events = window_manager(backend)
    c = finished(m, toks(20))
    handle = c.plan_committed_block_drop()
    assert handle is not None
    removed(events)
    with handle as entered:
        assert entered is handle
        assert m.probe_reuse(None, toks(20)) == 20
    assert removed(events) == [(WINDOW, 2)]
    raises_exactly(LogicError, handle.drop)
    # Dropped inside the block: its end does nothing more.
    finished(m, toks(20))
    with c.plan_committed_block_drop() as again:  # type: ignore[union-attr]
        again.drop()
    assert removed(events) == [(WINDOW, 2)]


def test_pages_dropped_meanwhile_are_skipped(backend: kv_api.Backend) -> None:
    """Pages evicted or cleared after planning are not the plan's, even where their slots (and,
    natively, their records) now serve other blocks."""
    m, events = window_manager(backend)
    handle = finished(m, toks(20)).plan_committed_block_drop()
    assert handle is not None
    m.clear_reusable_blocks()
    finished(m, toks(20, 500))  # new pages in the freed slots
    finished(m, toks(20))  # and the same blocks again, new pages
    removed(events)
    before = used(m)
    handle.drop()
    assert removed(events) == []
    assert used(m) == before
    assert m.probe_reuse(None, toks(20)) == 20
    assert m.probe_reuse(None, toks(20, 500)) == 20


def test_an_evicted_page_is_skipped_and_the_rest_still_go(backend: kv_api.Backend) -> None:
    """tpb 4, window 8, full attention and the window in pool groups of their own (64 and 16
    slots). 20 committed tokens plan the window pages of blocks 3 and 4; block 3's (priority 0)
    is evicted first when a request needs one window slot more than are free. The drop skips
    it and still drops block 4's."""
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    layers = [attention(0, GRAIN // 64), attention(1, GRAIN // 16, 8)]
    config = make_config(4, layers=layers, quota=2 * GRAIN, initial_pool_ratio=[0.5, 0.5])
    m = backend.KVCacheManager(config, events)
    assert [pg.num_slots for pg in m.pool_group_descs] == [64, 16]
    c = m.create_kv_cache(None, toks(20), None, lambda o, lc: 0 if (o, lc.id) == (3, WINDOW) else 100)
    assert c.resume() and c.resize(20)
    c.commit(toks(20), is_end=True)
    c.close()
    handle = c.plan_committed_block_drop()
    assert handle is not None
    assert used(m) == [(59, 5), (11, 5)] and removed(events) == []
    pressure = m.create_kv_cache(None, [])
    assert pressure.resume() and pressure.resize(4 * 12)  # 12 window slots: one page evicted
    assert removed(events) == [(WINDOW, 1)]
    assert m.probe_reuse(None, toks(20)) == 12
    pressure.close()
    assert used(m) == [(59, 5), (12, 4)]
    handle.drop()
    assert removed(events) == [(WINDOW, 1)]  # block 4's window page
    assert used(m) == [(59, 5), (13, 3)]


def test_a_drop_after_shutdown_does_nothing(backend: kv_api.Backend) -> None:
    m, _ = window_manager(backend)
    handle = finished(m, toks(20)).plan_committed_block_drop()
    assert handle is not None
    m.shutdown()
    handle.drop()
    raises_exactly(LogicError, handle.drop)


# -- both backends --------------------------------------------------------------------------------


def scenario(backend: kv_api.Backend) -> list[object]:
    """Plans on overlapping requests, one held, dropped in turn: everything observable."""
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    m = backend.KVCacheManager(hybrid_config(tokens_per_block=4, slots=32, window=8, sinks=2), events)
    trace: list[object] = []
    a = finished(m, toks(22)).plan_committed_block_drop()
    held = finished(m, [*toks(13), 90, 91], close=False)
    b = held.plan_committed_block_drop()
    c = finished(m, toks(17)).plan_committed_block_drop()
    for handle in (a, b, c):
        assert handle is not None
        trace.append(m.get_storage_statistics())
        handle.drop()
        trace.append((m.get_storage_statistics(), [m.probe_reuse(None, toks(n)) for n in (8, 13, 17, 22)]))
    held.close()
    trace.append(m.get_storage_statistics())
    events.flush_iteration_events()
    trace.append([(e.layer_group_id, e.data) for e in events.get_latest_events()])
    trace.append(m.get_committed_stats())
    return trace


def test_backends_agree(backends: list[kv_api.Backend]) -> None:
    traces = [scenario(b) for b in backends]
    assert all(t == traces[0] for t in traces[1:])
