"""Statistics counters that add up between resets and pending per-request stats that a discard
really empties (docs/manager.md, "Statistics"): SSM snapshots stored, skipped and reused are
counted per event until ``get_and_reset_ssm_snapshot_iteration_stats``; after
``discard_pending_stats`` the cache is no longer dirty and its pending delta starts from zero.
"""

from __future__ import annotations

import pytest

import kv_api
from kv_api import (
    KVCacheStatsDelta,
    SsmSnapshotStats,
)

from ._manager import hybrid_config, toks
from .test_manager_stats_surface import ssm_hybrid, ssm_slots_all_live


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
