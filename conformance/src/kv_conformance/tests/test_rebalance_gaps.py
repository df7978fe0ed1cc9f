"""The auto-tuner's arithmetic at its edges (docs/manager.md, "Rebalancing"): the decayed sums
start at zero (a sample of length 0 learns a typical length of 0, not 1), a history of 0 stays
0, a reused length stays what was sampled, and the plan is made at the device level's current
effective quota (after a quota resize too).

Two pool groups: full attention (32 KiB slots, 64 a grain) and a window (16 KiB slots, 128 a
grain) on a 32-grain device tier, as in test_rebalance.py. A split of the bytes ``f:w`` gives
the window ``round(32 * w / (f + w))`` grains and full attention the rest.
"""

from __future__ import annotations

from typing import Any

import pytest

import kv_api
from kv_api import BufferConfig, KVCacheManager, KVCacheManagerConfig, SwaScratchReuseConfig

from ._manager import GRAIN, attention, make_config

QUOTA = 32 * GRAIN
INITIAL = [1984, 128]  # one 2049-token request: the window keeps its minimum grain
SHORT = [1344, 1408]  # full attention and window slots 2:1 in bytes (11 window grains)


def config(tpb: int = 4, window: int = 8, **knobs: Any) -> KVCacheManagerConfig:
    args: dict[str, Any] = {
        "rebalance_min_sampled_kv_caches": 0,
        "rebalance_cooldown_secs": 0,
        "rebalance_target_ratio_update_interval": 1,
    }
    args.update(knobs)
    layers = [attention(0, 32 << 10), attention(1, 16 << 10, window)]
    return make_config(tpb, layers=layers, quota=QUOTA, **args)


def slots(m: KVCacheManager) -> list[int]:
    return [d.num_slots for d in m.pool_group_descs]


def test_an_empty_sample_learns_equal_shares(backend: kv_api.Backend) -> None:
    """A cache closed at capacity 0 is one sample of length 0: the typical request is
    ``KVCacheDesc(0, 0)``, which needs no slots, so the ratio is equal shares (16 grains each),
    not the 2:1 byte split a typical capacity of 1 would give."""
    m = backend.KVCacheManager(config())
    assert slots(m) == INITIAL
    m.create_kv_cache().close()
    assert m.need_adjustment
    assert m.adjust() and slots(m) == [1024, 2048]


def test_a_zero_history_stays_zero(backend: kv_api.Backend) -> None:
    """tpb 1, window 1: at history ``H`` the window's blocks below ``H`` are stale. A sample of
    capacity 8 at history 0 has all 8 blocks live in both groups (2:1 in bytes, SHORT); a
    typical history of 1 would make one window block stale (8:7 in slots)."""
    m = backend.KVCacheManager(config(tpb=1, window=1))
    c = m.create_kv_cache()
    assert c.resume() and c.resize(8, 0)
    c.close()
    assert m.adjust() and slots(m) == SHORT


def test_reused_length_is_what_was_sampled(backend: kv_api.Backend) -> None:
    """tpb 1, window 1, no reuse, capacity 8 at history 4: one more request costs 8 full
    attention blocks and 4 window blocks (the 4 below the history are stale): 256:64 KiB, the
    window's share 0.2, 6 grains. A typical reused prefix of 1 token would share one full
    attention block (224:64, 7 window grains)."""
    m = backend.KVCacheManager(config(tpb=1, window=1))
    c = m.create_kv_cache()
    assert c.resume() and c.resize(8, 4)
    c.close()
    assert m.adjust() and slots(m) == [1664, 768]


def test_the_plan_is_at_the_current_quota(backend: kv_api.Backend) -> None:
    """After a quota resize the plan is made at the new quota: with the tuned split in place at
    twice the quota, nothing is off the plan (at the configured quota the plan would be half
    the slots, off by more than the threshold), and adjust() keeps the split."""
    m = backend.KVCacheManager(config())
    c = m.create_kv_cache()
    assert c.resume() and c.resize(8)
    c.close()
    assert m.resize(0, 2 * QUOTA) and slots(m) == [4032, 128]  # the initial ratio: the window keeps 1 grain
    assert m.need_adjustment
    assert m.adjust() and slots(m) == [2752, 2688]  # 64 grains split 2:1 (43 and 21)
    assert not m.need_adjustment
    assert m.adjust() is False and slots(m) == [2752, 2688]


@pytest.mark.requires("swa_scratch")
def test_the_target_counts_scratch_blocks_at_their_scratch_cost(backends: list[kv_api.Backend]) -> None:
    """Full attention (32 KiB slots) and two window layers of 8 tokens sharing 16 KiB slots (each
    half a slot), with scratch reuse (rewind 0). The sampled request, capacity 64 and history 0,
    has 14 of its 16 window blocks in the scratch range (stale at 64, past the history): they
    cost ceil(14 / 2) = 7 slots, not 14, as the initial ratio and the minimum slots count them.
    So the learnt split gives the window pool group less than the same tuner without scratch
    reuse, and every backend splits alike."""

    def kv(size: int) -> list[BufferConfig]:
        return [BufferConfig("key", size // 2), BufferConfig("value", size // 2)]

    layers = [
        kv_api.AttentionLayerConfig(0, kv(32 << 10)),
        kv_api.AttentionLayerConfig(1, kv(8 << 10), 8),
        kv_api.AttentionLayerConfig(2, kv(8 << 10), 8),
    ]
    seen = []
    for backend in backends:
        split = []
        for scratch in (SwaScratchReuseConfig(0), None):
            m = backend.KVCacheManager(
                make_config(
                    4,
                    layers=layers,
                    quota=32 * GRAIN,
                    swa_scratch_reuse=scratch,
                    rebalance_min_sampled_kv_caches=0,
                    rebalance_cooldown_secs=0,
                    rebalance_target_ratio_update_interval=1,
                )
            )
            for _ in range(3):
                c = m.create_kv_cache()
                assert c.resume() and c.resize(64, 0)
                c.close()
            assert m.adjust()
            split.append([d.num_slots for d in m.pool_group_descs])
        with_scratch, without = split
        # Bytes per request: 16 x 32 KiB and 9 x 16 KiB with scratch, 16 x 16 KiB without.
        assert with_scratch[1] < without[1] and with_scratch[0] > without[0], split
        seen.append(split)
    assert all(s == seen[0] for s in seen[1:])
