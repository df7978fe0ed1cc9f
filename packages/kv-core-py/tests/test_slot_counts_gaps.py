"""Slot-count helpers that mutation testing (docs/mutation.md) found unchecked on their own:
``sequence_peak_slots`` against its definition (the most slots at any step of a request growing
one token per step) and ``bytes_ratio``'s shares, including the all-zero case."""

from __future__ import annotations

import pytest

from kv_api import AttentionLayerConfig, BatchDesc, BufferConfig, GpuCacheTierConfig, KVCacheDesc, KVCacheManagerConfig
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.slot_counts import GIB, bytes_ratio, sequence_peak_slots, slots_for_batch
from kv_core_py.storage_config import PoolGroupConfig


def layer(layer_id: int, window: int | None = None, sinks: int | None = None) -> AttentionLayerConfig:
    return AttentionLayerConfig(layer_id, [BufferConfig("kv", 4096)], window, sinks)


@pytest.mark.parametrize("tpb", [1, 2, 3, 4, 5, 8])
def test_sequence_peak_slots_is_the_most_any_step_needs(tpb: int) -> None:
    """For every length, the peak over the steps ``history h, capacity h + 1`` (``h < length``),
    counted step by step, on full attention and windows of every phase against the block."""
    layers = [layer(0), *(layer(1 + w, w) for w in range(1, 12)), layer(20, 6, 3), layer(21, 9, 5)]
    registry = LifeCycleRegistry(KVCacheManagerConfig(tpb, [GpuCacheTierConfig(GIB)], layers))
    for lc in range(len(registry.life_cycles)):
        peak = 0
        for length in range(1, 50):
            h = length - 1
            peak = max(peak, slots_for_batch(registry, lc, BatchDesc([KVCacheDesc(h + 1, h)])))
            assert sequence_peak_slots(registry, lc, length) == peak, (lc, registry.life_cycles[lc], length)


def groups(*slot_sizes: tuple[int, ...]) -> list[PoolGroupConfig]:
    return [PoolGroupConfig(i, (i,), sizes) for i, sizes in enumerate(slot_sizes)]


def test_bytes_ratio_is_each_group_share_of_the_bytes() -> None:
    """Slots times slot bytes (every pool of the group), over their sum: shares adding up to 1."""
    g = groups((2048, 1024), (1024,), (4096,))
    assert bytes_ratio([1, 3, 0], g) == [0.5, 0.5, 0.0]
    assert bytes_ratio([2, 0, 1], g) == [6144 / 10240, 0.0, 4096 / 10240]
    assert bytes_ratio([0, 4, 0], g) == [0.0, 1.0, 0.0]


def test_bytes_ratio_of_no_slots_is_equal_shares() -> None:
    assert bytes_ratio([0, 0], groups((1024,), (2048,))) == [0.5, 0.5]
    assert bytes_ratio([0, 0, 0, 0], groups((1,), (2,), (3,), (4,))) == [0.25] * 4
