"""Construction and memory layout: life cycles, layer groups, pools and pool groups, slot counts,
page-index arithmetic and the pools' memory (behaviour-spec §2-3, invariant 13)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kv_api
from kv_api import (
    BAD_PAGE_INDEX,
    AttentionLayerConfig,
    BatchDesc,
    BufferConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheDesc,
    KVCacheManagerConfig,
    PageIndexMode,
)
from kv_api.descriptors import LifeCycle, PageIndexConverter
from kv_api.errors import InvalidStateError

from ._manager import (
    GRAIN,
    MIB,
    active,
    attention,
    expected_life_cycles,
    hybrid_config,
    make_config,
    make_manager,
    pool_group_of,
    raises_exactly,
    stale_range,
)

TPB = 4
QUANT = [BufferConfig("key", 4096), BufferConfig("value", 4096), BufferConfig("scale", 512)]
#: Life cycles: 0 full (layers 0, 1), 1 window 16 (layer 2), 2 window 16 + 2 sink blocks
#: (layer 3, 5 sink tokens), 3 window 32 (layer 4, same slot sizes as life cycle 1).
LAYOUT_LAYERS = [
    AttentionLayerConfig(0, QUANT),
    AttentionLayerConfig(1, QUANT),
    AttentionLayerConfig(2, QUANT, sliding_window_size=16),
    AttentionLayerConfig(3, [BufferConfig("key", 2048, 2), BufferConfig("value", 8192)], 16, 5),
    AttentionLayerConfig(4, QUANT, sliding_window_size=32),
]
LAYOUT = KVCacheManagerConfig(TPB, [GpuCacheTierConfig(GRAIN)], LAYOUT_LAYERS)
ALL_BUFFERS = [(layer.layer_id, b.role) for layer in LAYOUT_LAYERS for b in layer.buffers]


def test_life_cycles_by_first_appearance(backend: kv_api.Backend) -> None:
    size = 64 * 1024
    layers = [
        attention(7, size, window=8, sinks=4),  # 1 sink block
        attention(3, size),
        attention(5, size, window=8, sinks=3),  # also 1 sink block: same life cycle as layer 7
        attention(0, size),
        attention(1, size, window=8),
        attention(2, size, window=16),
        attention(4, size, window=8),
    ]
    manager = make_manager(backend, make_config(TPB, layers=layers))
    expected = [LifeCycle(0, 8, 1, TPB), LifeCycle(1, None, 0, TPB), LifeCycle(2, 8, 0, TPB), LifeCycle(3, 16, 0, TPB)]
    assert expected_life_cycles(manager.init_config) == expected
    assert list(manager.life_cycles) == expected
    groups = {7: 0, 5: 0, 3: 1, 0: 1, 1: 2, 4: 2, 2: 3}
    for layer_id, group in groups.items():
        assert manager.get_layer_group_id(layer_id) == group
    grouping = manager.layer_grouping
    assert len(grouping) == 4
    for group in range(4):
        assert sorted(grouping[group]) == sorted(k for k, v in groups.items() if v == group)
    assert sorted(manager.layer_ids) == sorted(groups)
    assert manager.num_layers == 7


def test_priority_callback_receives_life_cycles(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, layers=[attention(0, 2048, 8, 1), attention(1, 2048)]))
    seen: list[tuple[int, LifeCycle]] = []

    def callback(ordinal: int, life_cycle: LifeCycle) -> int:
        seen.append((ordinal, life_cycle))
        return 35

    active(manager, 8, callback=callback).close()
    assert {(o, lc) for o, lc in seen} == {(o, lc) for o in (0, 1) for lc in expected_life_cycles(manager.init_config)}


def test_priority_callback_life_cycle_has_the_managers_stale_range(backend: kv_api.Backend) -> None:
    """The life cycle a priority callback gets has ``get_stale_range(history_length)``, the
    manager's own rule: the blocks it names are exactly those whose index reads BAD_PAGE_INDEX,
    for full attention, a window, and a window with 2 sink blocks, as history grows."""
    layers = [attention(0, GRAIN // 64), attention(1, GRAIN // 64, 8), attention(2, GRAIN // 64, 8, 5)]
    manager = make_manager(backend, make_config(TPB, layers=layers))
    seen: dict[int, LifeCycle] = {}

    def callback(ordinal: int, life_cycle: LifeCycle) -> int:
        seen[life_cycle.id] = life_cycle
        return 35

    cache = manager.create_kv_cache(None, None, None, callback)
    assert cache.resume()
    for history in range(41):
        assert cache.resize(history + 1, history)
        assert sorted(seen) == [0, 1, 2]
        for life_cycle in seen.values():
            begin, end = life_cycle.get_stale_range(history)
            assert range(begin, end) == stale_range(life_cycle, history, TPB)
            assert life_cycle.get_stale_range(history, TPB) == (begin, end)  # the reference's form
            indices = list(cache.get_base_page_indices(life_cycle.id))
            assert [o for o, index in enumerate(indices) if index == BAD_PAGE_INDEX] == list(range(begin, end))
    assert [seen[i] for i in range(3)] == list(manager.life_cycles)
    # At history 40: nothing stale, blocks 0-7 stale, sinks 0-1 kept and 2-7 stale.
    assert [seen[i].get_stale_range(40) for i in range(3)] == [(0, 0), (0, 8), (2, 8)]
    cache.close()


def test_zero_sinks_are_no_sinks(backend: kv_api.Backend) -> None:
    """``num_sink_tokens=0`` needs no window and changes nothing: with or without a window the
    layer shares the life cycle (layer group) of the same layer without the count."""
    size = 64 * 1024
    layers = [attention(0, size), attention(1, size, None, 0), attention(2, size, 8), attention(3, size, 8, 0)]
    manager = make_manager(backend, make_config(TPB, layers=layers))
    assert list(manager.life_cycles) == [LifeCycle(0, None, 0, TPB), LifeCycle(1, 8, 0, TPB)]
    assert [manager.get_layer_group_id(layer) for layer in range(4)] == [0, 0, 1, 1]
    plain = [attention(0, size), attention(1, size), attention(2, size, 8), attention(3, size, 8)]
    same = make_manager(backend, make_config(TPB, layers=plain))
    assert list(same.life_cycles) == list(manager.life_cycles)
    shape = [(pg.life_cycles, pg.num_slots, [p.slot_size for p in pg.pools]) for pg in manager.pool_group_descs]
    assert shape == [(pg.life_cycles, pg.num_slots, [p.slot_size for p in pg.pools]) for pg in same.pool_group_descs]


@pytest.mark.parametrize("layer_id", [-1, 2, 99])
def test_unknown_layer_is_a_key_error(backend: kv_api.Backend, layer_id: int) -> None:
    manager = make_manager(backend, make_config(TPB, layers=[attention(0, 2048), attention(1, 2048, 8)]))
    with pytest.raises(KeyError):
        manager.get_layer_group_id(layer_id)
    with pytest.raises(KeyError):
        manager.get_page_stride(layer_id, "key")
    with pytest.raises(KeyError):
        manager.get_page_stride(0, "no-such-role")


def test_pool_groups(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, LAYOUT)
    descs = manager.pool_group_descs
    # Per life cycle: pools by expanded size, descending; equal slot-size lists share a group.
    assert [pg.index for pg in descs] == [0, 1, 2]
    assert [pg.life_cycles for pg in descs] == [(0,), (1, 3), (2,)]
    assert [tuple(p.slot_size for p in pg.pools) for pg in descs] == [(16384, 1024), (8192, 512), (8192, 4096)]
    for pg in descs:
        assert pg.num_slots > 0
        addresses = [p.base_address for p in pg.pools]
        assert len(set(addresses)) == len(addresses)
    stats = manager.get_storage_statistics()
    assert [(s.total, s.free, s.evictable) for s in stats] == [(pg.num_slots, pg.num_slots, 0) for pg in descs]
    # Each of the six pools rounds up to a whole grain on its own, so one grain grows to six.
    assert manager.get_quota() == 6 * GRAIN


def test_spec_slot_count_vector(backend: kv_api.Backend) -> None:
    """behaviour-spec §3: tpb = W = 32, quota 5 x 2 MiB, an SWA slot of 2 MiB - 1 bytes and a
    full-attention slot of 2 MiB give two pool groups of 2 and 3 slots."""
    layers = [
        AttentionLayerConfig(0, [BufferConfig("kv", 2 * MIB - 1)], sliding_window_size=32),
        AttentionLayerConfig(1, [BufferConfig("kv", 2 * MIB)]),
    ]
    manager = make_manager(backend, KVCacheManagerConfig(32, [GpuCacheTierConfig(5 * GRAIN)], layers))
    descs = manager.pool_group_descs
    assert [pg.life_cycles for pg in descs] == [(0,), (1,)]
    assert [pg.num_slots for pg in descs] == [2, 3]
    assert [[p.slot_size for p in pg.pools] for pg in descs] == [[2 * MIB - 1], [2 * MIB]]
    assert manager.get_quota() == 5 * GRAIN
    assert [s.total for s in manager.get_storage_statistics()] == [2, 3]


BATCH = BatchDesc([KVCacheDesc(40, 39)] * 2)
MIN_SLOT_CASES: dict[str, tuple[KVCacheManagerConfig, int]] = {
    # Window 32 at tpb 4: (32 + 2) // 4 + 1 = 9 slots, and full attention gets the same floor.
    "window floor": (hybrid_config(TPB, slots=2, window=32), 18),
    # Five sink tokens are two sink blocks on top of the window floor.
    "sink blocks": (hybrid_config(TPB, slots=2, window=32, sinks=5), 22),
    # Two 10-block requests: ceil(20 / 0.97) = 21 slots of 1 MiB, rounded up to 11 grains.
    "constraint": (make_config(TPB, slots=2, constraints=[BATCH]), 22),
    # A capacity of 41 is 11 blocks (a partial last block needs its page): ceil(22 / 0.97) = 23,
    # rounded up to 12 grains.
    "partial block": (make_config(TPB, slots=2, constraints=[BatchDesc([KVCacheDesc(41, 39)] * 2)]), 24),
    # A 4-block system prompt is shared: ceil((4 + 2 * 6) / 0.97) = 17, rounded up to 9 grains.
    "system prompt": (make_config(TPB, slots=2, constraints=[BatchDesc(BATCH.kv_caches, 16)]), 18),
    "max util": (make_config(TPB, slots=2, constraints=[BATCH], max_util_for_resume=0.5), 40),
    # The window needs 2 blocks per request at history 39: max(3, ceil(4 / 0.97)) = 5, plus 21.
    "stale blocks": (hybrid_config(TPB, slots=2, window=8, constraints=[BATCH]), 26),
}


@pytest.mark.parametrize(("config", "slots"), MIN_SLOT_CASES.values(), ids=MIN_SLOT_CASES.keys())
def test_min_slots_raise_the_quota(backend: kv_api.Backend, config: KVCacheManagerConfig, slots: int) -> None:
    """A one-grain quota too small for the min slots grows to fit them (1 MiB slots)."""
    manager = make_manager(backend, config)
    assert [pg.num_slots for pg in manager.pool_group_descs] == [slots]
    assert manager.get_quota() == slots * MIB


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [((0.25, 0.75), [16, 24]), ((0.5, 0.5), [32, 16])],
)
def test_initial_pool_ratio_splits_the_quota(
    backend: kv_api.Backend, ratio: tuple[float, float], expected: list[int]
) -> None:
    layers = [attention(0, 256 * 1024), attention(1, 512 * 1024, window=4)]
    manager = make_manager(backend, make_config(TPB, layers=layers, quota=8 * GRAIN, initial_pool_ratio=ratio))
    assert [pg.num_slots for pg in manager.pool_group_descs] == expected
    assert manager.get_quota() == 8 * GRAIN


#: Layer groups 0 and 1 share pool group 0 (same slot sizes); layer group 2 is pool group 1.
SHARED_POOL_GROUP = [attention(0, 256 * 1024), attention(1, 256 * 1024, window=4), attention(2, 512 * 1024, window=8)]


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        ((0.125, 0.125, 0.75), [16, 24]),  # pool groups get 0.25 and 0.75, as above
        ((0.5, 0.25, 0.25), [48, 8]),  # 0.75 and 0.25: pool group 1 (the smaller share) goes first
        ((0.3, 0.3, 0.4), [40, 12]),  # 0.6 and 0.4: the sum, not the entries, orders the split
    ],
)
def test_initial_pool_ratio_is_per_layer_group(
    backend: kv_api.Backend, ratio: tuple[float, ...], expected: list[int]
) -> None:
    """One entry per layer group; a pool group takes the sum of its layer groups' entries."""
    manager = make_manager(
        backend, make_config(TPB, layers=SHARED_POOL_GROUP, quota=8 * GRAIN, initial_pool_ratio=ratio)
    )
    assert [pg.life_cycles for pg in manager.pool_group_descs] == [(0, 1), (2,)]
    assert [pg.num_slots for pg in manager.pool_group_descs] == expected


def test_layer_groups_sharing_a_pool_group_take_one_entry_each(backend: kv_api.Backend) -> None:
    """The reference's vector: two layer groups in one pool group accept ``[0.25, 0.75]``."""
    layers = SHARED_POOL_GROUP[:2]
    manager = make_manager(backend, make_config(TPB, layers=layers, quota=8 * GRAIN, initial_pool_ratio=[0.25, 0.75]))
    assert [pg.life_cycles for pg in manager.pool_group_descs] == [(0, 1)]
    assert [pg.num_slots for pg in manager.pool_group_descs] == [64]  # the whole quota


@given(weights=st.lists(st.floats(0.001, 1.0), min_size=3, max_size=3), grains=st.integers(6, 64))
def test_ratio_split_is_the_same_on_every_backend(
    backends: list[kv_api.Backend], weights: list[float], grains: int
) -> None:
    """Any per-layer-group ratio: every backend sums it per pool group and splits the quota into
    the same slot counts (every float step in the same order)."""
    if len(backends) < 2:
        pytest.skip("needs two backends (KV_BACKEND=all or a comma list)")
    ratio = [w / sum(weights) for w in weights]
    config = make_config(TPB, layers=SHARED_POOL_GROUP, quota=grains * GRAIN, initial_pool_ratio=ratio)
    managers = [make_manager(backend, config) for backend in backends]
    seen = {(tuple(pg.num_slots for pg in m.pool_group_descs), m.get_quota()) for m in managers}
    assert len(seen) == 1, seen


@pytest.mark.parametrize(
    ("layers", "ratio"),
    [
        ([attention(0, 256 * 1024), attention(1, 512 * 1024, window=4)], (1.0,)),
        ([attention(0, 256 * 1024), attention(1, 512 * 1024, window=4)], (0.5, 0.25, 0.25)),
        (SHARED_POOL_GROUP[:2], (1.0,)),  # one per pool group is too few
        (SHARED_POOL_GROUP, (0.25, 0.75)),
        # Empty: the length is the rule that fails first (as in the reference), not the sum.
        ([attention(0, 256 * 1024)], ()),
    ],
)
def test_initial_pool_ratio_length_must_match(
    backend: kv_api.Backend, layers: list[AttentionLayerConfig], ratio: tuple[float, ...]
) -> None:
    config = make_config(TPB, layers=layers, quota=8 * GRAIN, initial_pool_ratio=ratio)
    error = raises_exactly(ValueError, lambda: backend.KVCacheManager(config))
    assert str(error) == (
        "KVCacheManagerConfig.initial_pool_ratio: initial_pool_ratio length must match number of layer groups "
        f"(expected {len(expected_life_cycles(config))}, got {len(ratio)})"
    )


@pytest.mark.parametrize(("quota", "expected"), [(1, GRAIN), (GRAIN + 1, 2 * GRAIN), (3 * GRAIN, 3 * GRAIN)])
def test_quota_rounds_up_to_the_granularity(backend: kv_api.Backend, quota: int, expected: int) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8, quota=quota))
    assert manager.get_quota() == expected
    assert manager.get_quota(0) == expected
    assert manager.pool_group_descs[0].num_slots == 8 * expected // GRAIN
    with pytest.raises(IndexError):
        manager.get_quota(1)
    with pytest.raises(IndexError):
        manager.get_storage_statistics(1)


def test_page_index_converters(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, LAYOUT)
    expected = {
        (0, "key"): (4096, PageIndexConverter(4, 1, 0)),
        (0, "value"): (4096, PageIndexConverter(4, 1, 1)),
        (0, "scale"): (512, PageIndexConverter(2, 1, 0)),
        (1, "key"): (4096, PageIndexConverter(4, 1, 2)),
        (1, "value"): (4096, PageIndexConverter(4, 1, 3)),
        (1, "scale"): (512, PageIndexConverter(2, 1, 1)),
        (2, "key"): (4096, PageIndexConverter(2, 1, 0)),
        (2, "scale"): (512, PageIndexConverter(1, 1, 0)),
        # override 2 of tpb 4: two pages per block, and per scratch block
        (3, "key"): (2048, PageIndexConverter(1, 2, 0, 2)),
        (3, "value"): (8192, PageIndexConverter(1, 1, 0)),
        (4, "value"): (4096, PageIndexConverter(2, 1, 1)),
    }
    for (layer, role), (stride, converter) in expected.items():
        assert manager.get_page_stride(layer, role) == stride, (layer, role)
        assert manager.get_page_index_converter(layer, role) == converter, (layer, role)
    # Slot 3 of layer 3's key buffer is pages 6 and 7; -1 stays -1 (once per page).
    converter = manager.get_page_index_converter(3, "key")
    assert converter([3, -1]) == [6, 7, -1, -1]
    assert manager.get_page_index_converter(1, "value")([2]) == [2 * 4 + 3]
    assert manager.get_page_index_converter(1, "value")([2], PageIndexMode.SHARED) == [2 * 4]


def stride(manager: Any, layer: int, role: str) -> int:
    return int(manager.get_page_stride(layer, role))


def test_page_index_upper_bound(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, LAYOUT)
    for layer, role in ALL_BUFFERS:
        c = manager.get_page_index_converter(layer, role)
        num_slots = pool_group_of(manager, manager.get_layer_group_id(layer)).num_slots
        bound = manager.get_page_index_upper_bound(layer, role)
        assert bound == (c.scale * num_slots - c.layer_offset) * c.expansion, (layer, role)
        # Pages of ``stride`` bytes from the SHARED base address to the end of the pool.
        shared = manager.get_mem_pool_base_address(layer, role, PageIndexMode.SHARED)
        pool_end = manager.get_mem_pool_base_address(layer, role) + c.scale * num_slots * c.expansion * stride(
            manager, layer, role
        )
        assert bound * stride(manager, layer, role) == pool_end - shared, (layer, role)
        assert max(c(range(num_slots), PageIndexMode.SHARED)) < bound, (layer, role)


def test_mem_pool_base_addresses(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, LAYOUT)
    for layer, role in ALL_BUFFERS:
        pg = pool_group_of(manager, manager.get_layer_group_id(layer))
        c = manager.get_page_index_converter(layer, role)
        stride = manager.get_page_stride(layer, role)
        per_layer = manager.get_mem_pool_base_address(layer, role)
        assert manager.get_mem_pool_base_address(layer, role, PageIndexMode.PER_LAYER) == per_layer
        # The buffer's pool: the one whose slot holds ``scale`` buffers of ``stride * expansion``.
        pools = [p for p in pg.pools if p.base_address == per_layer]
        assert len(pools) == 1, (layer, role)
        assert pools[0].slot_size == c.scale * stride * c.expansion, (layer, role)
        shared = manager.get_mem_pool_base_address(layer, role, PageIndexMode.SHARED)
        assert shared == per_layer + c.layer_offset * stride * c.expansion, (layer, role)


def test_pool_memory(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, LAYOUT)
    views = []
    for pg in manager.pool_group_descs:
        for p, pool in enumerate(pg.pools):
            mem = manager.pool_memory(pg.index, p)
            assert isinstance(mem, memoryview)
            assert not mem.readonly
            assert mem.nbytes == pg.num_slots * pool.slot_size
            assert np.frombuffer(mem, dtype=np.uint8).ctypes.data == pool.base_address
            views.append(mem)
    # Pools never alias: a byte written through one view shows in no other.
    for i, mem in enumerate(views):
        mem[0] = 1 + i
        mem[len(mem) - 1] = 101 + i
    for i, mem in enumerate(views):
        assert (mem[0], mem[len(mem) - 1]) == (1 + i, 101 + i)
    last = len(manager.pool_group_descs) - 1
    with pytest.raises(IndexError):
        manager.pool_memory(last + 1, 0)
    with pytest.raises(IndexError):
        manager.pool_memory(0, len(manager.pool_group_descs[0].pools))


def test_pool_memory_bounds_are_named(backend: kv_api.Backend) -> None:
    """The first index past the end is refused with the range, like any other."""
    m = make_manager(backend, make_config(TPB, slots=8))
    assert len(m.pool_memory(0, 0)) == GRAIN
    assert str(raises_exactly(IndexError, lambda: m.pool_memory(1, 0))) == "pool_group 1 out of range (0..0)"
    assert str(raises_exactly(IndexError, lambda: m.pool_memory(0, 1))) == "pool 1 out of range (0..0)"


def test_host_tier_not_implemented(backend: kv_api.Backend) -> None:
    if backend.capabilities.host_tier:
        pytest.skip(f"backend {backend.name!r} supports a host tier")
    config = KVCacheManagerConfig(TPB, [GpuCacheTierConfig(GRAIN), HostCacheTierConfig(GRAIN)], [attention(0, 2048)])
    raises_exactly(NotImplementedError, lambda: backend.KVCacheManager(config))


def test_commit_min_snapshot_not_implemented(backend: kv_api.Backend) -> None:
    if backend.capabilities.ssm_layers:
        pytest.skip(f"backend {backend.name!r} supports SSM layers and snapshots")
    config = make_config(TPB, commit_min_snapshot=True)
    raises_exactly(NotImplementedError, lambda: backend.KVCacheManager(config))


@pytest.mark.parametrize("event_manager", [object(), "events", 1])
def test_bad_event_manager_is_a_type_error(backend: kv_api.Backend, event_manager: Any) -> None:
    raises_exactly(TypeError, lambda: backend.KVCacheManager(make_config(TPB), event_manager))
    raises_exactly(TypeError, lambda: backend.KVCacheManager(make_config(TPB), event_manager=event_manager))


def test_event_manager_serves_one_manager(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(16, "v2_sha256")
    make_manager(backend, event_manager=events)
    raises_exactly(ValueError, lambda: backend.KVCacheManager(make_config(TPB), events))


def test_layout_after_shutdown(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, LAYOUT)
    manager.shutdown()
    raises_exactly(InvalidStateError, lambda: manager.pool_group_descs)
    raises_exactly(InvalidStateError, lambda: manager.pool_memory(0, 0))
    raises_exactly(InvalidStateError, lambda: manager.get_mem_pool_base_address(0, "key"))
