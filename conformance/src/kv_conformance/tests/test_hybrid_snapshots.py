"""SSM layers and ``commit_min_snapshot`` (behaviour-spec §3, "Stale range", "commit_min_snapshot",
"Match pruning"; docs/manager.md, "Hybrid models"): one state slot per request, snapshots of it in
the block holding the last committed token with exact coverage, partial tails copied into the
tree, the live pages moved there on ``is_end``, window pages out of the window dropped rather
than committed, and a match cut to the last snapshot inside it (or to nothing, holding no
block). A snapshot copy that fails frees its copies; a state committed at the end stays
evictable; a full block's snapshot is not replaced by a later writer's.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import kv_api
from kv_api import (
    BAD_PAGE_INDEX,
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    HostMemoryCopier,
    KVCacheManagerConfig,
    PageCopier,
    SsmLayerConfig,
)
from kv_api.errors import LogicError
from kv_api.events import Stored

from ._manager import (
    GRAIN,
    MIB,
    check_accounting,
    fails_atomically,
    fill_slot,
    pool_group_of,
    raises_exactly,
    slot_bytes,
    toks,
)

pytestmark = pytest.mark.requires("ssm_layers")

FULL, WINDOW, SSM = 0, 1, 2  # layer groups (life cycles) of ``hybrid``
TPB = 4


def hybrid(
    tpb: int = 32, window: int = 64, ssm: bool = True, quota: int = 8 * MIB, **kwargs: object
) -> KVCacheManagerConfig:
    """Full attention, a window and (``ssm``) an SSM layer whose slot differs in size: the
    attention layers share one pool group, the SSM state has its own."""
    kv = [BufferConfig("key", 4096), BufferConfig("value", 4096)]
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [
        AttentionLayerConfig(0, kv),
        AttentionLayerConfig(1, kv, window),
    ]
    if ssm:
        layers.append(SsmLayerConfig(2, [BufferConfig("conv", 1024), BufferConfig("state", 16384)]))
    return KVCacheManagerConfig(tpb, [GpuCacheTierConfig(quota)], layers, commit_min_snapshot=True, **kwargs)  # type: ignore[arg-type]


def writer(manager: kv_api.KVCacheManager, capacity: int) -> kv_api.KVCache:
    cache = manager.create_kv_cache(None, [])
    assert cache.resume()
    assert cache.resize(capacity)
    return cache


def stored_blocks(events: kv_api.KVCacheEventManager) -> list[int]:
    """Blocks stored so far, per layer group."""
    events.flush_iteration_events()
    out = [0, 0, 0]
    for e in events.get_latest_events():
        if isinstance(e.data, Stored) and e.layer_group_id is not None:
            out[e.layer_group_id] += len(e.data.blocks)
    return out


def test_ssm_life_cycle_and_stale_range(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid())
    lcs = m.life_cycles
    assert [lc.ssm for lc in lcs] == [False, False, True]
    assert m.get_layer_group_id(2) == SSM
    assert lcs[SSM].get_stale_range(0) == (0, 0)
    assert lcs[SSM].get_stale_range(95) == (0, 2)
    assert lcs[SSM].get_stale_range(96) == (0, 3)
    # One slot of the SSM pool group is its floor: the constraint-free minimum.
    groups = {lc: pg for pg in m.pool_group_descs for lc in pg.life_cycles}
    assert groups[SSM].index != groups[FULL].index


def test_ssm_requires_commit_min_snapshot() -> None:
    with pytest.raises(ValueError, match="commit_min_snapshot"):
        KVCacheManagerConfig(4, [GpuCacheTierConfig(2 * MIB)], [SsmLayerConfig(0, [BufferConfig("state", 1024)])])


def test_one_state_slot_per_request(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid())
    a = m.create_kv_cache(None, [])
    raises_exactly(IndexError, lambda: a.get_ssm_block_base_index(3))
    assert a.get_ssm_block_base_index(SSM) == BAD_PAGE_INDEX  # suspended: no state yet
    assert a.resume()
    assert a.resize(200)  # a long capacity still needs one state slot
    b = writer(m, 10)
    slots = {a.get_ssm_block_base_index(SSM), b.get_ssm_block_base_index(SSM)}
    assert BAD_PAGE_INDEX not in slots and len(slots) == 2
    assert a.get_ssm_block_base_index(FULL) == BAD_PAGE_INDEX  # not an SSM group
    assert list(a.get_base_page_indices(SSM)) == [BAD_PAGE_INDEX] * a.num_blocks
    ssm_stats = m.get_storage_statistics()[1]
    assert ssm_stats.total - ssm_stats.free == 2
    a.suspend()
    assert a.get_ssm_block_base_index(SSM) == BAD_PAGE_INDEX
    assert a.resume()  # the same state, still held
    assert a.get_ssm_block_base_index(SSM) in slots
    a.close()
    b.close()
    assert m.get_storage_statistics()[1].free == ssm_stats.total  # uncommitted states are freed
    check_accounting(m, open_caches=False)


def test_spec_vector_window_pages_out_of_the_window_are_not_committed(backend: kv_api.Backend) -> None:
    """tpb 32, window 64, commit 128 tokens: the window's tree pages are [None, None, page, page];
    probe_reuse of 96 tokens is 0 and of 128 tokens is 128."""
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    m = backend.KVCacheManager(hybrid(ssm=False), events)
    c = writer(m, 128)
    c.commit(toks(128))
    assert stored_blocks(events)[:2] == [4, 2]
    assert list(c.get_page_levels(WINDOW)) == [-1, -1, 0, 0]
    assert m.probe_reuse(None, toks(96)) == 0
    assert m.probe_reuse(None, toks(128)) == 128
    c.close()
    assert m.probe_reuse(None, toks(96)) == 0
    assert m.probe_reuse(None, toks(128)) == 128


def test_without_commit_min_snapshot_window_pages_are_committed(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(1000, "v2_sha256")
    config = hybrid(ssm=False)
    m = backend.KVCacheManager(KVCacheManagerConfig(config.tokens_per_block, config.cache_tiers, config.layers), events)
    c = writer(m, 128)
    c.commit(toks(128))
    assert stored_blocks(events)[:2] == [4, 4]
    c.close()


def test_snapshot_at_the_last_committed_token(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid())
    c = writer(m, 200)
    c.commit(toks(40))  # one snapshot, 8 tokens into block 1
    assert m.probe_reuse(None, toks(40)) == 40
    assert m.probe_reuse(None, toks(48)) == 40
    assert m.probe_reuse(None, toks(39)) == 0  # no state before 40 tokens
    assert m.probe_reuse(None, toks(32)) == 0
    c.commit(toks(24, 40))  # 64: a snapshot ending block 1 exactly
    assert m.probe_reuse(None, toks(64)) == 64
    assert m.probe_reuse(None, toks(100)) == 64
    assert m.probe_reuse(None, toks(40)) == 0  # only the widest state of a block is kept
    c.commit(toks(6, 64))
    assert m.probe_reuse(None, toks(80)) == 70
    c.close()
    assert m.probe_reuse(None, toks(80)) == 70
    assert m.probe_reuse(None, [*toks(70), 99_999]) == 70
    check_accounting(m, open_caches=False)


def test_reused_snapshot_is_copied_into_a_private_state(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid())
    c = writer(m, 100)
    state = c.get_ssm_block_base_index(SSM)
    at_40 = fill_slot(m, SSM, state, seed=40)
    c.commit(toks(40))
    fill_slot(m, SSM, state, seed=41)  # the writer goes on: the snapshot must not change
    r = m.create_kv_cache(None, toks(50))
    assert r.num_reused_tokens == 40
    assert r.resume()
    mine = r.get_ssm_block_base_index(SSM)
    assert mine not in (BAD_PAGE_INDEX, state)
    assert slot_bytes(m, SSM, mine) == at_40
    fill_slot(m, SSM, mine, seed=99)  # the reader writes its own state: the tree's stays
    r2 = m.create_kv_cache(None, toks(40))
    assert r2.resume()
    assert slot_bytes(m, SSM, r2.get_ssm_block_base_index(SSM)) == at_40
    for cache in (c, r, r2):
        cache.close()
    check_accounting(m, open_caches=False)


def test_partial_tail_pages_are_copied_into_the_tree(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid())
    c = writer(m, 100)
    c.commit(toks(40))
    live = c.get_base_page_indices(FULL)[1]
    at_40 = slot_bytes(m, FULL, live)
    fill_slot(m, FULL, live, seed=7)  # the writer's tail page changes after the commit
    r = m.create_kv_cache(None, toks(40))
    assert r.num_reused_tokens == 40
    assert r.resume()
    assert slot_bytes(m, FULL, r.get_base_page_indices(FULL)[1]) == at_40
    r.close()
    c.close()
    check_accounting(m, open_caches=False)


def test_is_end_moves_the_live_pages(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid())
    c = writer(m, 100)
    c.commit(toks(30))
    used = [s.total - s.free for s in m.get_storage_statistics()]
    state = c.get_ssm_block_base_index(SSM)
    final = fill_slot(m, SSM, state, seed=3)
    c.commit(toks(10, 30), is_end=True)
    # Nothing copied: block 1's pages and the state went into the tree as they are, and block 0's
    # live pages replaced the copies of its first 30 tokens (its SSM snapshot at 30 stays).
    assert [s.total - s.free for s in m.get_storage_statistics()] == [used[0] - 2, used[1]]
    c.close()
    r = m.create_kv_cache(None, toks(40))
    assert r.num_reused_tokens == 40
    assert r.resume()
    assert slot_bytes(m, SSM, r.get_ssm_block_base_index(SSM)) == final
    r.close()
    check_accounting(m, open_caches=False)


def test_history_must_equal_the_committed_count(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid())
    c = writer(m, 100)
    c.commit(toks(10))
    assert c.resize(100, 20)  # history 20: a commit must end exactly there
    fails_atomically(m, [c], lambda: c.commit(toks(5, 10)), LogicError, probes=[(None, toks(20))])
    c.commit(toks(10, 10))
    assert c.num_committed_tokens == c.history_length == 20
    c.commit(toks(3, 20))  # history equal before the call: fine too
    c.close()


def test_no_room_for_a_snapshot_commits_the_tokens_without_one(backend: kv_api.Backend) -> None:
    # As many caches as states fit: no slot is left for a snapshot (nor, here, for the copies of
    # the attention pages: the two pool groups fill together).
    config = hybrid(quota=4 * MIB, max_util_for_resume=1.0)
    m = backend.KVCacheManager(config)
    ssm_slots = m.get_storage_statistics()[1].total
    caches = [writer(m, 8) for _ in range(ssm_slots)]
    caches[0].commit(toks(5))
    assert caches[0].num_committed_tokens == 5
    assert m.probe_reuse(None, toks(5)) == 0  # no state: nothing to reuse
    for cache in caches:
        cache.close()
    check_accounting(m, open_caches=False)


@pytest.mark.parametrize("tokens", [40, 64])
def test_backends_agree_on_snapshots(backends: list[kv_api.Backend], tokens: int) -> None:
    """Events and page indices alike, step by step, on every backend with SSM layers (the
    module's gate)."""
    seen = []
    for backend in backends:
        events = backend.KVCacheEventManager(1000, "v2_sha256")
        m = backend.KVCacheManager(hybrid(tpb=16, window=24), events)
        c = writer(m, 100)
        trace: list[object] = []
        for step in range(0, tokens, 12):
            c.commit(toks(min(12, tokens - step), step))
            trace.append([list(c.get_base_page_indices(lg)) for lg in range(3)])
            trace.append(c.get_ssm_block_base_index(SSM))
        c.close()
        r = m.create_kv_cache(None, toks(tokens + 5))
        assert r.resume()
        trace += [r.num_reused_tokens, r.get_ssm_block_base_index(SSM), m.get_storage_statistics()]
        events.flush_iteration_events()
        trace.append([(e.layer_group_id, e.data) for e in events.get_latest_events()])
        seen.append(trace)
    assert all(t == seen[0] for t in seen)


@pytest.mark.requires("ssm_layers")
def test_a_match_cut_to_nothing_holds_no_block(backend: kv_api.Backend) -> None:
    """tpb 32, window 64, commit_min_snapshot, 96 then 32 more tokens committed: a prompt of the first 32 or 64
    tokens finds no window page for the block it ends in, so the match is cut to nothing and
    the new cache holds no block at all (not an empty one)."""
    kv = [BufferConfig("key", 4096), BufferConfig("value", 4096)]
    layers = [AttentionLayerConfig(0, kv), AttentionLayerConfig(1, kv, 64)]
    config = KVCacheManagerConfig(32, [GpuCacheTierConfig(8 * MIB)], layers, commit_min_snapshot=True)
    m = backend.KVCacheManager(config)
    writer = m.create_kv_cache(None, [])
    assert writer.resume() and writer.resize(128)
    writer.commit(toks(96))
    writer.commit(toks(32, 96))
    writer.close()
    free = m.get_storage_statistics()
    for n in (32, 64):
        assert m.probe_reuse(None, toks(n)) == 0
        cache = m.create_kv_cache(None, toks(n))
        assert (cache.num_reused_tokens, cache.num_blocks) == (0, 0)
        assert [list(cache.get_page_levels(lg)) for lg in (0, 1)] == [[], []]
        assert m.get_storage_statistics() == free
        cache.close()
    cache = m.create_kv_cache(None, toks(96))
    assert (cache.num_reused_tokens, cache.num_blocks) == (96, 3)
    cache.close()


# -- snapshots of full attention and one SSM layer ------------------------------------------------

SSM_CONFIG_LG = 1  # ssm_config's SSM layer group


def ssm_config() -> KVCacheManagerConfig:
    """Full attention (layer group 0) and an SSM layer (layer group 1) of another slot size (so
    another pool group), commit_min_snapshot."""
    kv = [BufferConfig("key", 4096), BufferConfig("value", 4096)]
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [
        AttentionLayerConfig(0, kv),
        SsmLayerConfig(1, [BufferConfig("state", 16384)]),
    ]
    return KVCacheManagerConfig(TPB, [GpuCacheTierConfig(2 * GRAIN)], layers, commit_min_snapshot=True)


class FailingCopier(PageCopier):
    """``HostMemoryCopier`` that raises while ``fail`` is set."""

    def __init__(self) -> None:
        self.fail = False
        self.inner = HostMemoryCopier()

    def copy(self, src_level: int, dst_level: int, runs: Sequence[tuple[int, int, int]]) -> None:
        if self.fail:
            raise RuntimeError("copier failed")
        self.inner.copy(src_level, dst_level, runs)


@pytest.mark.requires("ssm_layers")
def test_a_failing_snapshot_copy_frees_the_copies(backend: kv_api.Backend) -> None:
    """commit_min_snapshot copies the partial tail into new pages; when the copy fails the
    copier's error propagates and the new pages are freed (nothing leaks)."""
    copier = FailingCopier()
    m = backend.KVCacheManager(ssm_config(), None, copier)
    free = [s.free for s in m.get_storage_statistics()]
    cache = m.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(16, 6)
    copier.fail = True
    err = raises_exactly(RuntimeError, lambda: cache.commit(toks(6)))
    assert str(err) == "copier failed"
    copier.fail = False
    cache.close()
    assert [s.free + s.evictable for s in m.get_storage_statistics()] == free
    assert [s.free for s in m.get_storage_statistics()] != free  # the first block was committed


@pytest.mark.requires("ssm_layers")
def test_a_state_committed_at_the_end_stays_evictable_after_suspend_and_close(backend: kv_api.Backend) -> None:
    """``commit(..., is_end=True)`` moves the live SSM state into the tree; suspending unlocks
    it and closing does not unlock it again: it ends evictable like every tree page."""
    m = backend.KVCacheManager(ssm_config(), None)
    cache = m.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(8)
    cache.commit(toks(6), is_end=True)
    cache.suspend()
    cache.close()
    stats = m.get_storage_statistics()
    assert all(s.free + s.evictable == s.total for s in stats), stats
    assert stats[pool_group_of(m, SSM_CONFIG_LG).index].evictable == 1
    check_accounting(m, open_caches=False)


@pytest.mark.requires("ssm_layers")
def test_an_empty_end_commit_of_a_zero_capacity_cache(backend: kv_api.Backend) -> None:
    """Nothing committed, no block: ``commit([], is_end=True)`` snapshots nothing."""
    m = backend.KVCacheManager(ssm_config(), None)
    cache = m.create_kv_cache(None, [])
    assert cache.resume()
    assert cache.num_blocks == 0
    cache.commit([], is_end=True)
    cache.close()
    check_accounting(m, open_caches=False)
    assert m.get_storage_statistics()[pool_group_of(m, SSM_CONFIG_LG).index].evictable == 0


@pytest.mark.requires("ssm_layers")
def test_a_full_block_snapshot_is_not_replaced_by_a_later_writer(backend: kv_api.Backend) -> None:
    """A full block whose SSM snapshot covers it already keeps it: a second request committing
    the same tokens adds no copy of its own state, so a reader resumes from the first one's."""
    m = backend.KVCacheManager(ssm_config(), None)
    first = b""
    for seed in (1, 2):
        cache = m.create_kv_cache(None, [])
        assert cache.resume() and cache.resize(8)
        data = fill_slot(m, SSM_CONFIG_LG, cache.get_ssm_block_base_index(SSM_CONFIG_LG), seed)
        first = first or data
        cache.commit(toks(8))
        cache.close()
    reader = m.create_kv_cache(None, toks(8))
    assert reader.num_reused_tokens == 8
    assert reader.resume()
    assert slot_bytes(m, SSM_CONFIG_LG, reader.get_ssm_block_base_index(SSM_CONFIG_LG)) == first
    reader.close()
