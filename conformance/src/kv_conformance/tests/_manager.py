"""Shared helpers for the manager tests: small configs, caches in a known state, invariant checks
and ``snapshot`` (everything a failing call must leave unchanged).

Managers and caches are typed by the contract (``kv_api.KVCacheManager``, ``kv_api.KVCache``):
the tests speak the documented API, whichever backend provides it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kv_api import (
    BAD_PAGE_INDEX,
    AttentionLayerConfig,
    Backend,
    BufferConfig,
    GpuCacheTierConfig,
    KVCache,
    KVCacheEventManager,
    KVCacheManager,
    KVCacheManagerConfig,
    KVCacheStatus,
    PriorityCallback,
    ReuseScope,
    SsmLayerConfig,
    StorageStatistics,
)
from kv_api.constants import ceil_div
from kv_api.descriptors import LifeCycle, PoolGroupDesc

MIB = 1 << 20
#: The smallest device granularity: quotas below 1 GiB are counted in 2 MiB grains.
GRAIN = 2 * MIB


def kv(size: int, tokens_per_block_override: int | None = None) -> list[BufferConfig]:
    """A key and a value buffer of ``size`` bytes each (one pool, slot = ``2 * size``), stored at
    ``tokens_per_block_override`` tokens a page if given."""
    return [
        BufferConfig("key", size, tokens_per_block_override),
        BufferConfig("value", size, tokens_per_block_override),
    ]


def attention(
    layer_id: int, slot_size: int, window: int | None = None, sinks: int | None = None
) -> AttentionLayerConfig:
    """An attention layer whose key+value slot is ``slot_size`` bytes."""
    return AttentionLayerConfig(layer_id, kv(slot_size // 2), window, sinks)


def make_config(
    tokens_per_block: int = 4,
    slots: int = 8,
    layers: Sequence[AttentionLayerConfig] | None = None,
    quota: int = GRAIN,
    **kwargs: Any,
) -> KVCacheManagerConfig:
    """One full-attention layer whose slot is ``GRAIN / slots`` bytes, so a one-grain quota
    gives exactly ``slots`` slots (unless ``layers`` says otherwise)."""
    if layers is None:
        layers = [attention(0, GRAIN // slots)]
    return KVCacheManagerConfig(
        tokens_per_block=tokens_per_block, cache_tiers=[GpuCacheTierConfig(quota)], layers=layers, **kwargs
    )


def hybrid_config(
    tokens_per_block: int = 4, slots: int = 16, window: int = 8, sinks: int | None = None, **kwargs: Any
) -> KVCacheManagerConfig:
    """Full attention (life cycle 0) plus a sliding window (life cycle 1) of the same slot size:
    one pool group of ``slots`` slots shared by both."""
    size = GRAIN // slots
    layers = [attention(0, size), attention(1, size, window, sinks)]
    return make_config(tokens_per_block, layers=layers, **kwargs)


def ssm_hybrid(tpb: int = 4, window: int = 8, quota: int = 8 * MIB, **kwargs: Any) -> KVCacheManagerConfig:
    """Full attention (0), a window (1) and an SSM layer (2) in its own pool group."""
    kv = [BufferConfig("key", 4096), BufferConfig("value", 4096)]
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [
        AttentionLayerConfig(0, kv),
        AttentionLayerConfig(1, kv, window),
        SsmLayerConfig(2, [BufferConfig("state", 16384)]),
    ]
    return KVCacheManagerConfig(tpb, [GpuCacheTierConfig(quota)], layers, commit_min_snapshot=True, **kwargs)


def with_two_snapshots(backend: Backend) -> KVCacheManager:
    """An ``ssm_hybrid`` manager holding tokens 0-9 committed as 8, then 2: SSM snapshots after
    token 8 (block 1's end) and after token 10 (in the partial tail [8, 9])."""
    m = backend.KVCacheManager(ssm_hybrid())
    w = m.create_kv_cache()
    assert w.resume() and w.resize(10)
    w.commit(toks(8))
    w.commit(toks(2, 8))
    w.close()
    return m


def make_manager(
    backend: Backend, config: KVCacheManagerConfig | None = None, event_manager: KVCacheEventManager | None = None
) -> KVCacheManager:
    return backend.KVCacheManager(config if config is not None else make_config(), event_manager)


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def priority(value: int) -> PriorityCallback:
    """A priority callback giving every page ``value``."""
    return lambda ordinal, life_cycle: value


def active(
    manager: KVCacheManager,
    capacity: int | None = None,
    tokens: Sequence[int] = (),
    *,
    scope: ReuseScope | None = None,
    reuse: Sequence[int] | None = None,
    callback: PriorityCallback | None = None,
) -> KVCache:
    """A resumed cache (reusing ``reuse`` if given) grown to ``capacity`` (default: what
    ``tokens`` need) with ``tokens`` committed after what it reused."""
    cache = manager.create_kv_cache(scope, reuse, None, callback)
    assert cache.resume(), "resume failed"
    cap = cache.num_committed_tokens + len(tokens) if capacity is None else capacity
    if cap != cache.capacity:
        assert cache.resize(cap), f"resize to {cap} failed"
    if tokens:
        cache.commit(list(tokens))
    return cache


def committed(
    manager: KVCacheManager,
    tokens: Sequence[int],
    *,
    scope: ReuseScope | None = None,
    callback: PriorityCallback | None = None,
) -> None:
    """Commit ``tokens`` in a fresh cache (no reuse) and close it: they become reusable."""
    active(manager, None, tokens, scope=scope, callback=callback).close()


def expected_life_cycles(config: KVCacheManagerConfig) -> list[LifeCycle]:
    """behaviour-spec §3: one life cycle per distinct (window, sink blocks), ids by first
    appearance in ``config.layers``; sinks count in blocks, rounded up; SSM layers share one."""
    out: list[LifeCycle] = []
    for layer in config.layers:
        if isinstance(layer, AttentionLayerConfig):
            window = layer.sliding_window_size
            sinks = ceil_div(layer.num_sink_tokens or 0, config.tokens_per_block) if window is not None else 0
            ssm = False
        else:
            window, sinks, ssm = None, 0, True
        if not any(lc.window == window and lc.num_sink_blocks == sinks and lc.ssm == ssm for lc in out):
            out.append(LifeCycle(len(out), window, sinks, config.tokens_per_block, ssm))
    return out


def life_cycles(manager: KVCacheManager) -> list[LifeCycle]:
    """The manager's life cycles as the spec derives them from its config."""
    return expected_life_cycles(manager.init_config)


def stale_range(life_cycle: LifeCycle, history: int, tokens_per_block: int) -> range:
    """behaviour-spec §3: ``[s, max(s, (H + 1 - W) // tpb))`` for a window, empty otherwise."""
    s = min(ceil_div(history, tokens_per_block), life_cycle.num_sink_blocks)
    if life_cycle.window is None:
        return range(s, s)
    return range(s, max(s, (history + 1 - life_cycle.window) // tokens_per_block))


def pool_group_of(manager: KVCacheManager, layer_group: int) -> PoolGroupDesc:
    """The ``PoolGroupDesc`` holding a layer group's pages."""
    groups = [pg for pg in manager.pool_group_descs if layer_group in pg.life_cycles]
    assert len(groups) == 1, f"layer group {layer_group} is in {len(groups)} pool groups"
    return groups[0]


def check_report(cache: KVCache, tokens_per_block: int) -> None:
    """A cache's reuse report (if on) adds up to its prompt: what was reused, per level as
    ``cached_tokens_by_level`` says, and each reason a token was not; the evicted tokens are
    those of its evicted blocks; the partial ones hold the prompt's tail."""
    r = cache.reuse_report
    if r is None:
        return
    parts = [
        sum(r.reused_tokens_by_level),
        r.miss_stale_tokens,
        r.miss_capped_tokens,
        r.miss_evicted_tokens,
        r.miss_partial_tokens,
        r.miss_never_seen_tokens,
        r.miss_other_scope_tokens,
    ]
    assert min(parts) >= 0 and sum(parts) == r.num_prompt_tokens, r
    assert list(r.reused_tokens_by_level) == cache.cached_tokens_by_level
    blocks = len(r.evicted_blocks)
    assert (blocks - 1) * tokens_per_block < r.miss_evicted_tokens <= blocks * tokens_per_block or blocks == 0 == (
        r.miss_evicted_tokens
    ), r
    assert all(e.age >= 0 and e.level >= 0 for e in r.evicted_blocks)
    assert r.num_prompt_tokens % tokens_per_block <= r.miss_partial_tokens + sum(parts[:3]), r


def check_lengths(cache: KVCache) -> None:
    """Invariant 1."""
    tpb = cache.tokens_per_block
    assert cache.num_committed_tokens <= cache.history_length <= cache.capacity
    assert cache.num_blocks == ceil_div(cache.capacity, tpb)


def check_indices(manager: KVCacheManager, cache: KVCache) -> None:
    """Invariant 6: an ACTIVE cache has a valid slot for every non-stale, non-scratch block and
    -1 for the others (its scratch slots are valid too); any other cache reports -1 everywhere. Slots of one layer group are distinct. An SSM
    layer group has no page per block, only the request's state while it is active."""
    tpb = manager.tokens_per_block
    for lc in life_cycles(manager):
        indices = list(cache.get_base_page_indices(lc.id))
        assert len(indices) == cache.num_blocks
        state = cache.get_ssm_block_base_index(lc.id)
        if lc.ssm:
            assert indices == [BAD_PAGE_INDEX] * cache.num_blocks
            active = cache.status == KVCacheStatus.ACTIVE
            assert 0 <= state < pool_group_of(manager, lc.id).num_slots if active else state == BAD_PAGE_INDEX
            continue
        assert state == BAD_PAGE_INDEX
        if cache.status != KVCacheStatus.ACTIVE:
            assert indices == [BAD_PAGE_INDEX] * cache.num_blocks
            continue
        stale = stale_range(lc, cache.history_length, tpb)
        num_slots = pool_group_of(manager, lc.id).num_slots
        scratch = cache.get_scratch_desc(lc.id)
        scratch_blocks = range(0) if scratch is None else scratch.range
        scratch_slots = [] if scratch is None else list(scratch.slot_ids)
        assert all(0 <= slot < num_slots for slot in scratch_slots)
        for o, index in enumerate(indices):
            if o in stale or o in scratch_blocks:
                assert index == BAD_PAGE_INDEX, f"stale or scratch block {o} of layer group {lc.id} has slot {index}"
            else:
                assert 0 <= index < num_slots, f"block {o} of layer group {lc.id} has slot {index}"
        valid = [i for i in indices if i != BAD_PAGE_INDEX] + scratch_slots
        assert len(set(valid)) == len(valid), f"layer group {lc.id} repeats a slot: {indices} {scratch_slots}"


def check_page_levels(manager: KVCacheManager, cache: KVCache) -> None:
    """docs/manager.md, "Page status": no locked page below the device level, and an ACTIVE cache
    holds a page it does not lock (index -1) only while it is commit-pending: a stale window block
    not wholly committed yet, never with ``commit_min_snapshot``. Other caches' pages may be anywhere."""
    if cache.status != KVCacheStatus.ACTIVE:
        return
    tpb = manager.tokens_per_block
    pending_ok = not manager.init_config.commit_min_snapshot
    for lc in life_cycles(manager):
        stale = stale_range(lc, cache.history_length, tpb)
        levels = cache.get_page_levels(lc.id)
        for o, (index, level) in enumerate(zip(cache.get_base_page_indices(lc.id), levels, strict=True)):
            if index != BAD_PAGE_INDEX:
                assert level == 0, f"a locked page below the device level: block {o}, layer group {lc.id}: {levels}"
            elif level != -1:
                pending = pending_ok and o in stale and (o + 1) * tpb > cache.num_committed_tokens
                assert pending, f"a page held without its index: block {o}, layer group {lc.id}: {levels}"


def check_accounting(manager: KVCacheManager, open_caches: bool = True) -> None:
    """Invariant 12: per pool group, ``0 <= free``, ``0 <= evictable`` and
    ``free + evictable <= total == num_slots``; with no open cache nothing is in use."""
    stats = manager.get_storage_statistics()
    descs = manager.pool_group_descs
    assert len(stats) == len(descs)
    for s, pg in zip(stats, descs, strict=True):
        assert s.total == pg.num_slots
        assert s.free >= 0 and s.evictable >= 0
        assert s.free + s.evictable <= s.total
        if not open_caches:
            assert s.free + s.evictable == s.total, f"pool group {pg.index}: {s} with no open cache"


@dataclass(frozen=True)
class CacheState:
    status: KVCacheStatus
    num_committed_tokens: int
    history_length: int
    capacity: int
    num_blocks: int
    indices: tuple[tuple[int, ...], ...]
    levels: tuple[tuple[int, ...], ...]  # per layer group, the cache level of each block's page


@dataclass(frozen=True)
class Snapshot:
    stats: tuple[StorageStatistics, ...]
    caches: tuple[CacheState, ...]
    probes: tuple[int, ...]


def cache_state(manager: KVCacheManager, cache: KVCache) -> CacheState:
    return CacheState(
        cache.status,
        cache.num_committed_tokens,
        cache.history_length,
        cache.capacity,
        cache.num_blocks,
        tuple(tuple(cache.get_base_page_indices(lc.id)) for lc in life_cycles(manager)),
        tuple(tuple(cache.get_page_levels(lc.id)) for lc in life_cycles(manager)),
    )


def snapshot(
    manager: KVCacheManager,
    caches: Iterable[KVCache] = (),
    probes: Iterable[tuple[ReuseScope | None, Sequence[int]]] = (),
) -> Snapshot:
    """What a failing call must leave unchanged: storage statistics of every level, each cache's
    lengths, status, page indices and levels, and what ``probes`` (scope, tokens) would reuse."""
    return Snapshot(
        tuple(
            s for level in range(len(manager.init_config.cache_tiers)) for s in manager.get_storage_statistics(level)
        ),
        tuple(cache_state(manager, c) for c in caches),
        tuple(manager.probe_reuse(scope, list(tokens)) for scope, tokens in probes),
    )


def raises_exactly(error: type[BaseException], call: Callable[[], object]) -> BaseException:
    """``call()`` raises ``error`` itself (not a subclass), as every backend must."""
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error, f"expected {error.__name__}, got {type(info.value).__name__}: {info.value}"
    return info.value


def fails_atomically(
    manager: KVCacheManager,
    caches: Sequence[KVCache],
    call: Callable[[], object],
    error: type[BaseException] | None = None,
    probes: Iterable[tuple[ReuseScope | None, Sequence[int]]] = (),
) -> None:
    """``call()`` raises ``error`` (or returns False when ``error`` is None) and changes nothing."""
    probes = list(probes)
    before = snapshot(manager, caches, probes)
    if error is None:
        assert call() is False
    else:
        raises_exactly(error, call)
    assert snapshot(manager, caches, probes) == before


# -- page data --------------------------------------------------------------------------------


def slot_bytes(manager: KVCacheManager, layer_group: int, slot: int) -> bytes:
    """The bytes of ``slot`` in every pool of the layer group's pool group, concatenated."""
    pg = pool_group_of(manager, layer_group)
    out = b""
    for p, pool in enumerate(pg.pools):
        mem = manager.pool_memory(pg.index, p)
        out += bytes(mem[slot * pool.slot_size : (slot + 1) * pool.slot_size])
    return out


def fill_slot(manager: KVCacheManager, layer_group: int, slot: int, seed: int) -> bytes:
    """Write a pattern derived from ``seed`` over ``slot`` in every pool; return what was written."""
    pg = pool_group_of(manager, layer_group)
    out = b""
    for p, pool in enumerate(pg.pools):
        pattern = bytes((seed * 131 + p * 17 + i * 7) & 0xFF for i in range(251))
        data = (pattern * ceil_div(pool.slot_size, len(pattern)))[: pool.slot_size]
        mem = manager.pool_memory(pg.index, p)
        mem[slot * pool.slot_size : (slot + 1) * pool.slot_size] = data
        out += data
    return out
