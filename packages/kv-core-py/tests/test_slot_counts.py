"""The slot-count math on its own (docs/manager.md, "Sizing"; behaviour-spec §3 "Quotas and
granularity", invariant 13): granularity, grains, min slots, the ratio split and ``bytes_ratio``'s
shares, ``slots_for_batch`` and ``sequence_peak_slots`` against their definitions."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from kv_api import (
    AttentionLayerConfig,
    BatchDesc,
    BufferConfig,
    GpuCacheTierConfig,
    KVCacheDesc,
    KVCacheManagerConfig,
    SwaScratchReuseConfig,
)
from kv_api.constants import TOKEN_LIMIT
from kv_api.errors import HostOOMError
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.scratch import ScratchRule, scratch_rules
from kv_core_py.slot_counts import (
    GIB,
    MIB,
    SlotCounts,
    bytes_ratio,
    compute_min_slots,
    distribute,
    gpu_granularity,
    grains_for,
    max_slots,
    min_quota,
    pool_group_ratio,
    sequence_peak_slots,
    slots_for_batch,
)
from kv_core_py.storage_config import PoolGroupConfig, StorageConfig


def layer(layer_id: int, slot_size: int, window: int | None = None, sinks: int | None = None) -> AttentionLayerConfig:
    """One buffer of ``slot_size`` bytes: a layer group alone in its pool group has that slot size."""
    return AttentionLayerConfig(layer_id, [BufferConfig("kv", slot_size)], window, sinks)


def counts(tokens_per_block: int, quota: int, layers: list[AttentionLayerConfig], **kwargs: Any) -> SlotCounts:
    config = KVCacheManagerConfig(tokens_per_block, [GpuCacheTierConfig(quota)], layers, **kwargs)
    registry = LifeCycleRegistry(config)
    return SlotCounts(config, registry, StorageConfig(config, registry))


@pytest.mark.parametrize(
    ("quota", "granularity"),
    [
        (1, 2 * MIB),
        (GIB - 1, 2 * MIB),
        (GIB, 2 * MIB),  # floor(log2(1)) = 0
        (2 * GIB - 1, 2 * MIB),
        (2 * GIB, 4 * MIB),
        (3 * GIB, 4 * MIB),  # floor(log2(3)) = 1
        (8 * GIB, 16 * MIB),
        (16 * GIB, 32 * MIB),
        (1 << 50, 32 * MIB),  # capped at 2 MiB << 4
    ],
)
def test_granularity(quota: int, granularity: int) -> None:
    """``2 MiB << min(4, max(0, floor(log2(quota / 1 GiB))))``."""
    assert gpu_granularity(quota) == granularity


def test_each_pool_rounds_up_on_its_own() -> None:
    # 3 slots: 3 MiB + 3 bytes -> 2 grains; 3 MiB -> 2 grains; together they would fit in 3.
    assert grains_for(3, [MIB + 1, MIB], 2 * MIB) == 4
    assert grains_for(0, [MIB], 2 * MIB) == 0


@pytest.mark.parametrize("sizes", [[MIB], [MIB + 1, MIB], [3 * MIB, 5 * 1024], [2 * MIB - 1]])
def test_max_slots_is_the_most_that_fit(sizes: list[int]) -> None:
    g = 2 * MIB
    for grains in range(12):
        slots = max_slots(grains, sizes, g)
        assert grains_for(slots, sizes, g) <= grains < grains_for(slots + 1, sizes, g)


def test_min_slots_floors() -> None:
    """A window needs ``sinks + (W + tpb - 2) // tpb + 1`` slots (it straddles one more block
    while it slides); full attention the largest window floor; each pool group sums its layer
    groups. tpb 4: window 8 -> 3; window 8 with 5 sink tokens (2 blocks) -> 5; window 5 -> 2."""
    layers = [layer(0, 4096), layer(1, 4096, 8), layer(2, 1024, 8, 5), layer(3, 2048, 5)]
    config = KVCacheManagerConfig(4, [GpuCacheTierConfig(GIB)], layers)
    registry = LifeCycleRegistry(config)
    storage = StorageConfig(config, registry)
    assert [registry.min_slots_floor(lc) for lc in range(4)] == [5, 3, 5, 2]
    assert [pg.life_cycles for pg in storage.pool_groups] == [(0, 1), (2,), (3,)]
    assert compute_min_slots(config, registry, storage) == [8, 5, 2]


def test_min_slots_without_a_window() -> None:
    assert counts(4, 1, [layer(0, 4096)]).min_slots == [1]


def test_constraints_keep_resume_headroom() -> None:
    """A constraint batch needs ``ceil(slots / max_util_for_resume)``: 2 requests of 10 blocks
    at 0.97 need ceil(20 / 0.97) = 21 slots; at 0.5, 40."""
    batch = BatchDesc([KVCacheDesc(40, 39)] * 2)
    assert counts(4, 1, [layer(0, MIB)], constraints=[batch]).min_slots == [21]
    assert counts(4, 1, [layer(0, MIB)], constraints=[batch], max_util_for_resume=0.5).min_slots == [40]


def test_the_quota_grows_to_the_min_slots() -> None:
    """Effective quota: ``max(min_quota, round_up(quota, g))``, each pool rounded up on its own."""
    batch = BatchDesc([KVCacheDesc(40, 39)] * 2)
    assert counts(4, 1, [layer(0, MIB)], constraints=[batch]).quota == 11 * 2 * MIB  # 21 slots: 11 grains
    assert counts(4, 2 * MIB + 1, [layer(0, MIB)]).quota == 4 * MIB


def test_spec_vector_two_and_three_slots() -> None:
    """behaviour-spec §3: tpb = W = 32 gives a window floor of 2 and a full-attention floor of 2;
    a one-block constraint at 0.97 needs 2. A quota of 5 grains with slots of 2 MiB - 1 (window)
    and 2 MiB (full) splits into 2 and 3 slots."""
    layers = [layer(0, 2 * MIB - 1, 32), layer(1, 2 * MIB)]
    result = counts(32, 5 * 2 * MIB, layers, constraints=[BatchDesc([KVCacheDesc(32, 31)])])
    assert result.min_slots == [2, 2]
    assert result.slots == [2, 3]
    assert result.quota == 5 * 2 * MIB


def groups(*slot_sizes: tuple[int, ...]) -> list[PoolGroupConfig]:
    return [PoolGroupConfig(i, (i,), sizes) for i, sizes in enumerate(slot_sizes)]


def test_split_rounds_half_to_even() -> None:
    """10 grains at 0.25 / 0.75 (1-grain slots): round(2.5) is 2, as Python's ``round``."""
    g = 2 * MIB
    assert distribute([0.25, 0.75], [0, 0], groups((g,), (g,)), 10, g) == [2, 8]
    assert distribute([0.75, 0.25], [0, 0], groups((g,), (g,)), 10, g) == [8, 2]


def test_split_goes_in_ascending_ratio_order() -> None:
    """5 grains at 0.2 / 0.5 / 0.3: 0.2 takes round(1.0) = 1, then 0.3 takes
    round(4 * 0.3 / 0.8) = round(1.4999999999999998) = 1, and 0.5 the 3 left. In index order
    it would be 1, round(2.5) = 2, 2: the order and every float step are part of the result."""
    g = 2 * MIB
    assert distribute([0.2, 0.5, 0.3], [0, 0, 0], groups((g,), (g,), (g,)), 5, g) == [1, 3, 1]


def test_split_pins_groups_at_their_minimum() -> None:
    """A group whose share is at or below its minimum is pinned there and the rest re-split."""
    g = 2 * MIB
    assert distribute([0.1, 0.9], [3, 0], groups((g,), (g,)), 10, g) == [3, 7]
    assert distribute([0.5, 0.5], [3, 0], groups((g,), (g,)), 10, g) == [5, 5]  # above it: not pinned


def test_leftover_grains_go_to_groups_in_index_order() -> None:
    """Slots of 1.5 grains: each 4-grain share holds 2 slots in 3 grains; the 2 grains left over
    make one more slot, for the first group that can use them."""
    g = 2 * MIB
    assert distribute([0.5, 0.5], [0, 0], groups((3 * MIB,), (3 * MIB,)), 8, g) == [3, 2]


def test_pool_group_ratio_sums_layer_groups_in_order() -> None:
    """``initial_pool_ratio`` has one entry per layer group; a pool group takes the sum of its
    layer groups' entries, added in layer-group order (0.1 + 0.2 is 0.30000000000000004)."""
    shared = [PoolGroupConfig(0, (0, 2), (MIB,)), PoolGroupConfig(1, (1,), (2 * MIB,))]
    assert pool_group_ratio([0.25, 0.5, 0.25], shared) == [0.5, 0.5]
    assert pool_group_ratio([0.1, 0.7, 0.2], shared) == [0.1 + 0.2, 0.7]
    with pytest.raises(ValueError, match=r"initial_pool_ratio length must match number of layer groups \(expected 3"):
        pool_group_ratio([0.5, 0.5], shared)


def test_ratio_of_layer_groups_sharing_a_pool_group() -> None:
    """Two layer groups in one pool group take ``[0.25, 0.75]``: the pool group gets everything."""
    layers = [layer(0, MIB), layer(1, MIB, 8)]
    assert counts(4, 8 * 2 * MIB, layers, initial_pool_ratio=[0.25, 0.75]).slots == [16]


def test_bytes_ratio_is_each_group_share_of_the_bytes() -> None:
    """Slots times slot bytes (every pool of the group), over their sum: shares adding up to 1."""
    g = groups((2048, 1024), (1024,), (4096,))
    assert bytes_ratio([1, 3, 0], g) == [0.5, 0.5, 0.0]
    assert bytes_ratio([2, 0, 1], g) == [6144 / 10240, 0.0, 4096 / 10240]
    assert bytes_ratio([0, 4, 0], g) == [0.0, 1.0, 0.0]


def test_bytes_ratio_of_no_slots_is_equal_shares() -> None:
    assert bytes_ratio([0, 0], groups((1024,), (2048,))) == [0.5, 0.5]
    assert bytes_ratio([0, 0, 0, 0], groups((1,), (2,), (3,), (4,))) == [0.25] * 4


def slots_for_batch_by_block(
    registry: LifeCycleRegistry, life_cycle: int, batch: BatchDesc, scratch: ScratchRule | None = None
) -> int:
    """The definition, block by block (the former implementation): the oracle for small batches.
    Scratch blocks have no page: they cost ``scratch.slots(n)`` per request."""
    tpb = registry.tokens_per_block
    sys_blocks = batch.system_prompt_length // tpb
    shared: set[int] = set()
    total = 0
    for desc in batch.kv_caches:
        num_blocks = -(-desc.capacity // tpb)
        begin, end = registry.stale_range(life_cycle, desc.history_length)
        a, b = (0, 0) if scratch is None else scratch.range(desc.capacity, desc.history_length)
        paged = [o for o in range(num_blocks) if not begin <= o < end and not a <= o < b]
        live_sys = [o for o in paged if o < sys_blocks]
        shared.update(live_sys)
        total += len(paged) - len(live_sys) + (0 if scratch is None else scratch.slots(b - a))
    return total + len(shared)


@pytest.mark.parametrize("tpb", [1, 3, 4])
def test_slots_for_batch_with_scratch_counts_as_the_definition(tpb: int) -> None:
    """The same with sliding-window scratch (random rewinds): scratch blocks leave the shared and
    private counts, and cost their scratch slots instead."""
    rng = random.Random(tpb)
    layers = [layer(0, 4096), layer(1, 2048, 8), layer(2, 2048, 8), layer(3, 4096, 5, 3), layer(4, 1024, 1)]
    for rewind in (0, 3, 9):
        config = KVCacheManagerConfig(
            tpb, [GpuCacheTierConfig(GIB)], layers, swa_scratch_reuse=SwaScratchReuseConfig(rewind)
        )
        registry = LifeCycleRegistry(config)
        rules = scratch_rules(config, registry, StorageConfig(config, registry))
        assert [r is not None for r in rules] == [False, True, True, True]
        for _ in range(200):
            descs = []
            for _ in range(rng.randint(1, 4)):
                capacity = rng.randint(0, 60)
                descs.append(KVCacheDesc(capacity, rng.randint(0, capacity)))
            batch = BatchDesc(descs, system_prompt_length=rng.randint(0, 70))
            for lc, rule in enumerate(rules):
                got = slots_for_batch(registry, lc, batch, rule)
                assert got == slots_for_batch_by_block(registry, lc, batch, rule), (lc, batch)


@pytest.mark.parametrize("tpb", [1, 3, 4])
def test_slots_for_batch_counts_ranges_as_the_definition_counts_blocks(tpb: int) -> None:
    """Random small batches on full attention, windows and sinks: the range arithmetic gives the
    block-by-block count exactly (shared system-prompt blocks once, stale ones not at all)."""
    rng = random.Random(tpb)
    layers = [layer(0, 4096), layer(1, 4096, 8), layer(2, 4096, 5, 3), layer(3, 4096, 1)]
    registry = LifeCycleRegistry(KVCacheManagerConfig(tpb, [GpuCacheTierConfig(GIB)], layers))
    for _ in range(400):
        descs = []
        for _ in range(rng.randint(1, 4)):
            capacity = rng.randint(0, 60)
            descs.append(KVCacheDesc(capacity, rng.randint(0, capacity)))
        batch = BatchDesc(descs, system_prompt_length=rng.randint(0, 70))
        for lc in range(len(registry.life_cycles)):
            assert slots_for_batch(registry, lc, batch) == slots_for_batch_by_block(registry, lc, batch), (lc, batch)


def test_slots_for_batch_time_does_not_depend_on_the_system_prompt() -> None:
    layers = [layer(0, 4096, 8)]
    registry = LifeCycleRegistry(KVCacheManagerConfig(1, [GpuCacheTierConfig(GIB)], layers))
    # Window 8, tpb 1: both requests keep the same last blocks of the shared prompt, as many at
    # 2**40 tokens as at 1,000 (the block-by-block oracle counts the latter).
    small = BatchDesc([KVCacheDesc(1000, 1000)] * 2, system_prompt_length=1000)
    expected = slots_for_batch_by_block(registry, 0, small)
    n = TOKEN_LIMIT - 1
    start = time.perf_counter()
    assert slots_for_batch(registry, 0, BatchDesc([KVCacheDesc(n, n)] * 2, system_prompt_length=n)) == expected
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("tpb", [1, 2, 3, 4, 5, 8])
def test_sequence_peak_slots_is_the_most_any_step_needs(tpb: int) -> None:
    """For every length, the peak over the steps ``history h, capacity h + 1`` (``h < length``),
    counted step by step, on full attention and windows of every phase against the block."""
    layers = [
        layer(0, 4096),
        *(layer(1 + w, 4096, w) for w in range(1, 12)),
        layer(20, 4096, 6, 3),
        layer(21, 4096, 9, 5),
    ]
    registry = LifeCycleRegistry(KVCacheManagerConfig(tpb, [GpuCacheTierConfig(GIB)], layers))
    for lc in range(len(registry.life_cycles)):
        peak = 0
        for length in range(1, 50):
            h = length - 1
            peak = max(peak, slots_for_batch(registry, lc, BatchDesc([KVCacheDesc(h + 1, h)])))
            assert sequence_peak_slots(registry, lc, length) == peak, (lc, registry.life_cycles[lc], length)


def test_min_quota_refuses_2_63_bytes_exactly() -> None:
    """Below 2**63 bytes the minimum is returned; at 2**63 (here 2**40 slots of 2**23 bytes,
    already a multiple of the grain) it is a HostOOMError."""
    group = PoolGroupConfig(0, (0,), (2**23,))
    assert min_quota([2**40 - 1], [group], 2 * MIB) == (2**40 - 1) * 2**23
    with pytest.raises(HostOOMError, match=r"^device tier: the minimum slots need 2\*\*63 bytes or more$"):
        min_quota([2**40], [group], 2 * MIB)
