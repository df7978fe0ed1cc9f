"""The auto-tuner (docs/manager.md, "Rebalancing"; behaviour-spec §2 ``need_adjustment``,
``adjust()`` and §3 "Quota resize / rebalance"): closing caches are sampled, a target split of
the device quota between pool groups is learnt from them, ``need_adjustment`` gates on the sample
count, the cooldown and the threshold, and ``adjust()`` re-splits the quota with every cache
suspended, keeping the minimum slots, page data and reuse.

What is learnt: the decayed sums start at zero (a sample of length 0 learns a typical length of
0, not 1), a history of 0 stays 0, a reused length stays what was sampled, and scratch blocks
count at their scratch cost. The plan is made at the device level's current quota (after a
quota resize too), and an ``adjust()`` that cannot fit the held pages leaves the initial split.

The config has two pool groups: full attention (32 KiB slots, 64 a grain) and a window of 8
tokens (16 KiB slots, 128 a grain), on a 32-grain device tier. A short request (capacity and
history 8, 2 blocks) needs 2 slots of each, so its bytes split 2:1 and the window takes
``round(32 / 3) = 11`` grains: 1408 slots, full attention the other 21 grains, 1344 slots. The
initial split (one 2049-token request) leaves the window its minimum grain: [1984, 128].
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from typing import Any

import pytest

import kv_api
from kv_api import (
    BatchDesc,
    BufferConfig,
    GpuCacheTierConfig,
    KVCacheDesc,
    KVCacheManager,
    KVCacheManagerConfig,
    SwaScratchReuseConfig,
)
from kv_api.errors import InvalidStateError

from ._manager import GRAIN, attention, fill_slot, make_config, raises_exactly, slot_bytes, toks

TPB = 4
WINDOW = 8
QUOTA = 32 * GRAIN
INITIAL = [1984, 128]
SHORT = [1344, 1408]  # the split short requests call for
LAYERS = [attention(0, 32 << 10), attention(1, 16 << 10, WINDOW)]
#: Every request 8 tokens long, 200 at once: both life cycles need ceil(400 / 0.97) = 413 slots.
CONSTRAINED = [BatchDesc([KVCacheDesc(8, 8)] * 200)]


def config(tpb: int = TPB, window: int = WINDOW, **knobs: Any) -> KVCacheManagerConfig:
    """Full attention plus a window (``LAYERS`` by default), with an eager tuner unless ``knobs``
    say otherwise."""
    args: dict[str, Any] = {
        "rebalance_min_sampled_kv_caches": 0,
        "rebalance_cooldown_secs": 0,
        "rebalance_target_ratio_update_interval": 1,
    }
    args.update(knobs)
    layers = LAYERS if window == WINDOW else [attention(0, 32 << 10), attention(1, 16 << 10, window)]
    return make_config(tpb, layers=layers, quota=QUOTA, **args)


def slots(m: KVCacheManager) -> list[int]:
    return [d.num_slots for d in m.pool_group_descs]


def feed(m: KVCacheManager, count: int, capacity: int, history: int | None = None) -> None:
    """``count`` caches of these lengths (history: the capacity) closed: each one a sample."""
    for _ in range(count):
        c = m.create_kv_cache()
        assert c.resume()
        assert c.resize(capacity, capacity if history is None else history)
        c.close()


# -- the knobs ------------------------------------------------------------------------------------


BAD_KNOBS: list[tuple[str, Any, type[Exception], str]] = [
    ("rebalance_min_sampled_kv_caches", -1, ValueError, "must be in [0, 9223372036854775808) (got -1)"),
    ("rebalance_min_sampled_kv_caches", 1 << 63, ValueError, "must be in [0, 9223372036854775808)"),
    ("rebalance_min_sampled_kv_caches", 2.0, TypeError, "expected an int, got float"),
    ("rebalance_min_sampled_kv_caches", True, TypeError, "expected an int, got bool"),
    ("rebalance_target_ratio_update_interval", 0, ValueError, "must be in [1, 9223372036854775808)"),
    ("rebalance_target_ratio_update_interval", "1", TypeError, "expected an int, got str"),
    ("rebalance_cooldown_secs", -0.5, ValueError, "must be >= 0 (got -0.5)"),
    ("rebalance_cooldown_secs", math.nan, ValueError, "must be >= 0 (got nan)"),
    ("rebalance_cooldown_secs", None, TypeError, "expected a number, got NoneType"),
    ("rebalance_cooldown_secs", 1 << 1100, ValueError, "is out of range"),
    ("rebalance_ratio_threshold", 1, ValueError, "must be > 1 (got 1)"),
    ("rebalance_ratio_threshold", 0.5, ValueError, "must be > 1 (got 0.5)"),
    ("rebalance_ratio_threshold", math.nan, ValueError, "must be > 1 (got nan)"),
    ("rebalance_ratio_threshold", False, TypeError, "expected a number, got bool"),
    ("rebalance_moving_average_decay", 0, ValueError, "must be in (0, 1) (got 0)"),
    ("rebalance_moving_average_decay", 1.0, ValueError, "must be in (0, 1) (got 1.0)"),
    ("rebalance_moving_average_decay", math.nan, ValueError, "must be in (0, 1) (got nan)"),
    ("rebalance_moving_average_decay", "0.5", TypeError, "expected a number, got str"),
]


@pytest.mark.parametrize(("field", "value", "error", "rule"), BAD_KNOBS, ids=lambda v: repr(v)[:40])
def test_bad_knobs_name_the_field(field: str, value: Any, error: type[Exception], rule: str) -> None:
    exc = raises_exactly(error, lambda: config(**{field: value}))
    assert str(exc).startswith(f"KVCacheManagerConfig.{field}: "), exc
    assert rule in str(exc), exc


def test_knob_defaults_and_values_reach_the_backend(backend: kv_api.Backend) -> None:
    c = make_config()
    assert (
        c.rebalance_min_sampled_kv_caches,
        c.rebalance_cooldown_secs,
        c.rebalance_target_ratio_update_interval,
        c.rebalance_ratio_threshold,
        c.rebalance_moving_average_decay,
    ) == (2000, 120.0, 100, 1.25, 0.9999)
    # Defaults: 2000 samples first, so a few short requests change nothing.
    m = backend.KVCacheManager(make_config(TPB, layers=LAYERS, quota=QUOTA))
    feed(m, 100, 8)
    assert not m.need_adjustment
    assert m.adjust() and slots(m) == SHORT  # the target is learnt every 100 samples
    # Each knob is read by the backend: one sample short of the minimum, then enough.
    m = backend.KVCacheManager(config(rebalance_min_sampled_kv_caches=3))
    feed(m, 2, 8)
    assert not m.need_adjustment
    feed(m, 1, 8)
    assert m.need_adjustment


# -- gating ---------------------------------------------------------------------------------------


def test_nothing_learnt_before_the_first_update(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(config(rebalance_target_ratio_update_interval=3))
    assert slots(m) == INITIAL
    feed(m, 2, 8)
    assert not m.need_adjustment
    assert m.adjust() is False and slots(m) == INITIAL
    feed(m, 1, 8)
    assert m.need_adjustment
    assert m.adjust() is True and slots(m) == SHORT
    assert not m.need_adjustment  # the split is the plan now
    assert m.adjust() is False


def test_excluded_caches_are_not_sampled(backend: kv_api.Backend) -> None:
    """``mark_stats_excluded`` keeps a cache out of the tuner's samples: with an update every 3
    samples, two excluded closes and two counted ones learn nothing; a third counted one does."""
    m = backend.KVCacheManager(config(rebalance_target_ratio_update_interval=3))
    for cache_id in (100, 101):
        m.mark_stats_excluded(cache_id)
        c = m.create_kv_cache(None, None, cache_id)
        assert c.resume() and c.resize(8, 8)
        c.close()
    feed(m, 2, 8)
    assert not m.need_adjustment
    feed(m, 1, 8)
    assert m.need_adjustment


def test_cooldown(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(config(rebalance_cooldown_secs=3600))
    feed(m, 1, 8)
    assert not m.need_adjustment  # from the manager's construction
    assert m.adjust() and slots(m) == SHORT  # adjust() itself is not gated

    cooldown = 1.0
    m = backend.KVCacheManager(config(rebalance_cooldown_secs=cooldown))
    feed(m, 1, 8)
    assert not m.need_adjustment
    time.sleep(cooldown + 0.1)
    assert m.need_adjustment
    assert m.adjust() and slots(m) == SHORT
    feed(m, 1, 400)  # long requests: the window's share shrinks
    assert not m.need_adjustment  # the cooldown restarted
    time.sleep(cooldown + 0.1)
    assert m.need_adjustment


@pytest.mark.parametrize(("threshold", "due"), [(10.999, True), (11.0, False), (11.5, False)])
def test_threshold(backend: kv_api.Backend, threshold: float, due: bool) -> None:
    """The window goes from 128 slots to 1408, 11 times as many (full attention only 1.48 times
    fewer): due when the threshold is below 11, not at 11 (more than the factor is needed)."""
    m = backend.KVCacheManager(config(rebalance_ratio_threshold=threshold))
    feed(m, 1, 8)
    assert m.need_adjustment is due
    assert m.adjust() and slots(m) == SHORT


# -- what is learnt -------------------------------------------------------------------------------


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


# -- adjust ---------------------------------------------------------------------------------------


def test_adjust_needs_every_cache_suspended(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(config())
    feed(m, 1, 8)
    cache = m.create_kv_cache()
    assert cache.resume()
    exc = raises_exactly(InvalidStateError, m.adjust)
    assert str(exc) == "adjust() requires every KV cache suspended (1 active)"
    assert slots(m) == INITIAL and m.need_adjustment
    cache.suspend()
    assert m.adjust() and slots(m) == SHORT
    cache.close()
    m.shutdown()
    for call in (m.adjust, lambda: m.need_adjustment):
        assert str(raises_exactly(InvalidStateError, call)) == "the manager is shut down"


def test_adjust_keeps_the_minimum_slots(backend: kv_api.Backend) -> None:
    """Constraints floor both groups at 413 slots; the initial split is their bytes (2:1), so
    SHORT. Long requests (100 blocks of full attention, 2 of the window) want the window at 0
    grains: it is pinned at 413 slots (4 grains, which hold 512), full attention takes 28."""
    m = backend.KVCacheManager(config(constraints=CONSTRAINED))
    assert slots(m) == SHORT
    feed(m, 1, 400)
    assert m.need_adjustment
    assert m.adjust()
    assert slots(m) == [1792, 512]
    assert [s.total for s in m.get_storage_statistics()] == [1792, 512]
    assert not m.need_adjustment and m.adjust() is False


def test_resize_keeps_the_tuned_split(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(config())
    feed(m, 1, 8)
    assert m.adjust() and slots(m) == SHORT
    assert m.resize(0, QUOTA) and slots(m) == SHORT
    assert m.resize(0, 2 * QUOTA) and slots(m) == [2752, 2688]  # 64 grains split 2:1 (43 and 21)


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


def test_adjust_splits_the_resized_quota(backend: kv_api.Backend) -> None:
    """After a device quota resize, ``adjust`` re-splits that quota, not the configured one."""
    m = backend.KVCacheManager(config())
    assert slots(m) == INITIAL
    feed(m, 3, 8)
    assert m.resize(0, QUOTA // 2)
    assert m.adjust()
    assert m.get_quota(0) == QUOTA // 2
    # As a manager configured with that quota splits it.
    half = backend.KVCacheManager(replace(config(), cache_tiers=[GpuCacheTierConfig(QUOTA // 2)]))
    feed(half, 3, 8)
    assert half.adjust()
    assert slots(m) == slots(half) == [704, 640]


def test_a_refused_adjust_leaves_the_initial_split_for_later_resizes(backend: kv_api.Backend) -> None:
    """``adjust`` that cannot fit the held pages changes nothing, and a later quota resize
    still splits by the initial ratio (the tuner's split was never applied)."""
    m = backend.KVCacheManager(config())
    feed(m, 3, 8)
    holder = m.create_kv_cache(None, None, 77)
    m.mark_stats_excluded(77)  # its close is no sample: the target stays
    assert holder.resume() and holder.resize(1400 * TPB, 1400 * TPB)  # 1400 full-attention pages > SHORT[0]
    holder.suspend()
    assert m.adjust() is False
    assert slots(m) == INITIAL
    holder.close()
    m.clear_reusable_blocks()
    assert m.resize(0, QUOTA)
    assert slots(m) == INITIAL
    assert m.adjust() and slots(m) == SHORT  # the target is still there to apply


def test_page_data_and_reuse_survive(backend: kv_api.Backend) -> None:
    """A committed prompt whose window pages sit in slots the window loses (a big cache took
    the low ones first) keeps its bytes and stays reusable through an adjust()."""
    m = backend.KVCacheManager(config(constraints=CONSTRAINED, rebalance_target_ratio_update_interval=3))
    feed(m, 3, 400)  # the target is learnt now; the caches below do not change it
    big = m.create_kv_cache()
    assert big.resume() and big.resize(2400)  # 600 slots of each group
    writer = m.create_kv_cache()
    assert writer.resume() and writer.resize(12)
    data = {
        (lg, o): fill_slot(m, lg, slot, 10 * lg + o)
        for lg in range(2)
        for o, slot in enumerate(writer.get_base_page_indices(lg))
    }
    assert min(writer.get_base_page_indices(1)) >= 600
    writer.commit(toks(12))
    writer.close()
    big.close()
    assert m.probe_reuse(None, toks(12)) == 12
    assert m.adjust() and slots(m) == [1792, 512]
    assert m.probe_reuse(None, toks(12)) == 12
    reader = m.create_kv_cache(None, toks(12))
    assert reader.num_committed_tokens == 12 and reader.resume()
    full, window = (list(reader.get_base_page_indices(lg)) for lg in range(2))
    assert window[0] == -1 and all(0 <= s < 512 for s in window[1:])  # block 0 is out of the window
    for o, slot in enumerate(full):
        assert slot_bytes(m, 0, slot) == data[0, o]
    for o in (1, 2):
        assert slot_bytes(m, 1, window[o]) == data[1, o]
    reader.close()


# -- both backends alike --------------------------------------------------------------------------


def trace(backend: kv_api.Backend, seed: int) -> list[Any]:
    """Random requests (some reusing a committed prompt), with the tuner's answers and the
    slot counts after each, adjusting whenever it is due."""
    rng = random.Random(seed)
    m = backend.KVCacheManager(
        config(
            rebalance_moving_average_decay=rng.choice([0.5, 0.9, 0.9999]),
            rebalance_target_ratio_update_interval=rng.choice([1, 3]),
            rebalance_min_sampled_kv_caches=rng.choice([0, 5]),
            rebalance_ratio_threshold=rng.choice([1.01, 1.25, 2.0]),
        )
    )
    prompt = toks(40, 1000)
    writer = m.create_kv_cache()
    assert writer.resume() and writer.resize(40)
    writer.commit(prompt)
    writer.close()
    out: list[Any] = []
    for _ in range(60):
        reuse = prompt[: rng.randrange(0, 41)] if rng.random() < 0.5 else None
        c = m.create_kv_cache(None, reuse)
        capacity = c.num_committed_tokens + rng.randrange(0, 200)
        if c.resume() and c.resize(capacity, rng.randrange(c.history_length, capacity + 1)):
            c.suspend()
        c.close()
        due = m.need_adjustment
        out.append((due, m.adjust() if due else None, slots(m)))
    assert any(step[1] for step in out), "the trace never adjusted"
    return out


@pytest.mark.parametrize("seed", range(6))
def test_backends_agree(backends: list[kv_api.Backend], seed: int) -> None:
    if len(backends) < 2:
        pytest.skip("needs two backends (KV_BACKEND=all or a comma list)")
    first, *rest = (trace(b, seed) for b in backends)
    for other in rest:
        assert other == first
