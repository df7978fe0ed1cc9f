"""From a cache level's quota to slot counts per pool group (docs/manager.md, "Sizing").

Every step is integer arithmetic except the ratio split, whose float operations happen in a
fixed order and round half to even, so the native backend reproduces them exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kv_api.config import QUOTA_LIMIT, BatchDesc, KVCacheDesc, KVCacheManagerConfig
from kv_api.constants import CacheTier, ceil_div
from kv_api.errors import HostOOMError
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.scratch import ScratchRule, scratch_rules
from kv_core_py.storage_config import PoolGroupConfig, StorageConfig

MIB = 1 << 20
GIB = 1 << 30
FALLBACK_BATCH = BatchDesc([KVCacheDesc(2049, 2048)])


def gpu_granularity(quota: int) -> int:
    """``2 MiB << min(4, max(0, floor(log2(quota / 1 GiB))))``: 2 to 32 MiB."""
    exponent = 0 if quota < GIB else min(4, quota.bit_length() - 1 - 30)
    return (2 * MIB) << exponent


#: Granularity of the host and disk tiers (the device tier's depends on its quota).
HOST_GRANULARITY = 4 << 10
DISK_GRANULARITY = 2 * MIB
TIER_NAMES = {CacheTier.GPU_MEM: "device", CacheTier.HOST_MEM: "host", CacheTier.DISK: "disk"}


def tier_granularity(tier: CacheTier, quota: int) -> int:
    if tier == CacheTier.GPU_MEM:
        return gpu_granularity(quota)
    return HOST_GRANULARITY if tier == CacheTier.HOST_MEM else DISK_GRANULARITY


def grains_for(slots: int, slot_sizes: Sequence[int], granularity: int) -> int:
    """Grains a pool group of ``slots`` slots occupies: each pool rounds up on its own."""
    return sum(ceil_div(slots * size, granularity) for size in slot_sizes)


def max_slots(grains: int, slot_sizes: Sequence[int], granularity: int) -> int:
    """The most slots whose pools fit in ``grains`` grains."""
    lo, hi = 0, grains * granularity // max(slot_sizes)  # the largest pool alone bounds it
    while lo < hi:  # lo fits; nothing above hi does
        mid = (lo + hi + 1) // 2
        if grains_for(mid, slot_sizes, granularity) <= grains:
            lo = mid
        else:
            hi = mid - 1
    return lo


def slots_for_batch(
    registry: LifeCycleRegistry, layer_group: int, batch: BatchDesc, scratch: ScratchRule | None = None
) -> int:
    """Slots one layer group needs to hold ``batch`` at once: each request's non-stale blocks,
    with system-prompt blocks shared (counted once, unless stale for every request); an SSM layer
    group needs one state slot per request. With a ``scratch`` rule a request's scratch blocks
    have no page of their own: their ``n`` cost ``scratch.slots(n)``."""
    if not registry.kinds[layer_group].has_block_pages:
        return len(batch.kv_caches)  # a state each
    tokens_per_block = registry.tokens_per_block
    sys_blocks = batch.system_prompt_length // tokens_per_block
    # Counted as ranges, never block by block: a system prompt may span 2**40 blocks. A request's
    # live system-prompt blocks are [0, m) less its stale range [begin, end) and its scratch range
    # [a, b) (which lies above the stale one): at most three ranges.
    shared: list[tuple[int, int]] = []
    total = 0
    for desc in batch.kv_caches:
        num_blocks = ceil_div(desc.capacity, tokens_per_block)
        begin, end = registry.stale_range(layer_group, desc.history_length)
        stale = max(0, min(end, num_blocks) - min(begin, num_blocks))
        a, b = (end, end) if scratch is None else scratch.range(desc.capacity, desc.history_length)
        m = min(sys_blocks, num_blocks)
        if begin >= end:
            live = [(0, min(m, a)), (max(b, 0), m)]
        else:
            live = [(0, min(m, begin)), (max(end, 0), min(m, a)), (max(b, end, 0), m)]
        live = [(lo, hi) for lo, hi in live if lo < hi]
        shared.extend(live)
        total += num_blocks - stale - (b - a) + (0 if scratch is None else scratch.slots(b - a))
        total -= sum(hi - lo for lo, hi in live)
    return total + union_length(shared)


def sequence_peak_slots(registry: LifeCycleRegistry, layer_group: int, length: int) -> int:
    """The most slots one layer group needs at once for a request growing one token per step to
    ``length`` tokens (history ``h``, capacity ``h + 1`` for each ``h < length``): never fewer
    at a longer length. A window's need is periodic once its blocks turn stale, highest just
    before its stale range grows (``(h + 2 - W) % tokens_per_block == 0``), so the last such step and the
    final one bound it."""
    last = length - 1
    need = slots_for_batch(registry, layer_group, BatchDesc([KVCacheDesc(length, last)]))
    h = registry.kinds[layer_group].peak_history(last)
    if h is not None:
        need = max(need, slots_for_batch(registry, layer_group, BatchDesc([KVCacheDesc(h + 1, h)])))
    return need


def clamp_max_seq_len(
    registry: LifeCycleRegistry, storage: StorageConfig, slots: Sequence[int], batch_size: int, upper_bound: int
) -> int:
    """The largest multiple of tokens_per_block ``L <= upper_bound`` such that ``batch_size - 1``
    one-token requests (capacity 1, history 0: a slot each in every layer group) and one request
    growing to ``L`` tokens (``sequence_peak_slots``) fit ``slots`` in every pool group; 0 if
    none does. The need grows with ``L``, so a binary search finds it."""
    tokens_per_block = registry.tokens_per_block

    def fits(length: int) -> bool:
        return all(
            sum(batch_size - 1 + sequence_peak_slots(registry, group, length) for group in pg.life_cycles)
            <= slots[pg.index]
            for pg in storage.pool_groups
        )

    lo, hi = 0, upper_bound // tokens_per_block  # in blocks: lo fits (0: nothing), nothing above hi does
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * tokens_per_block):
            lo = mid
        else:
            hi = mid - 1
    return lo * tokens_per_block


def union_length(ranges: list[tuple[int, int]]) -> int:
    """The number of ints in the union of the half-open ``ranges`` (each non-empty)."""
    count, reach = 0, 0
    for lo, hi in sorted(ranges):
        lo = max(lo, reach)  # the part below reach is counted already
        if hi > lo:
            count += hi - lo
            reach = hi
    return count


def min_quota_error(tier: str = "device") -> HostOOMError:
    """A tier's minimum (its slot floors times their sizes, rounded to grains) is 2**63 bytes or
    more: more than any quota may be (``QUOTA_LIMIT``) or a pool can map. Raised before anything
    is allocated; the message names no number, which only Python could hold exactly."""
    return HostOOMError(f"{tier} tier: the minimum slots need 2**63 bytes or more")


def min_quota(minimum: list[int], groups: Sequence[PoolGroupConfig], granularity: int, tier: str = "device") -> int:
    """The bytes the minimum slots occupy, each pool rounded up to grains; below 2**63 or raises."""
    total = sum(
        ceil_div(minimum[pg.index] * size, granularity) * granularity for pg in groups for size in pg.slot_sizes
    )
    if total >= QUOTA_LIMIT:
        raise min_quota_error(tier)
    return total


def compute_min_slots(config: KVCacheManagerConfig, registry: LifeCycleRegistry, storage: StorageConfig) -> list[int]:
    """Per pool group: the sum over its layer groups of max(structural floor, each constraint
    batch's need scaled by ``1 / max_util_for_resume`` so resume keeps its headroom)."""
    per_layer_group = []
    rules = scratch_rules(config, registry, storage)
    for layer_group in range(len(registry.life_cycles)):
        floor = registry.min_slots_floor(layer_group)
        for batch in config.constraints:
            need = slots_for_batch(registry, layer_group, batch, rules[layer_group]) / config.max_util_for_resume
            if not need < QUOTA_LIMIT:  # inf included: so many slots need 2**63 bytes or more
                raise min_quota_error()
            floor = max(floor, math.ceil(need))
        per_layer_group.append(floor)
    return [sum(per_layer_group[group] for group in pg.life_cycles) for pg in storage.pool_groups]


def pool_group_ratio(ratio: Sequence[float], groups: Sequence[PoolGroupConfig]) -> list[float]:
    """Per pool group, the sum of its layer groups' entries of ``initial_pool_ratio`` (one per
    layer group), added in layer-group order (not ``sum``, which compensates since Python 3.12)."""
    layer_groups = sum(len(pg.life_cycles) for pg in groups)
    if len(ratio) != layer_groups:
        raise ValueError(
            "KVCacheManagerConfig.initial_pool_ratio: initial_pool_ratio length must match number of layer groups "
            f"(expected {layer_groups}, got {len(ratio)})"
        )
    out = []
    for pg in groups:
        share = 0.0
        for group in pg.life_cycles:
            share += ratio[group]
        out.append(share)
    return out


def initial_ratio(
    config: KVCacheManagerConfig, registry: LifeCycleRegistry, storage: StorageConfig, minimum: list[int]
) -> list[float]:
    """Share of the quota per pool group: ``initial_pool_ratio``, else the bytes of
    ``typical_step``, else of the constraint floors, else of one 2049-token request."""
    groups = storage.pool_groups
    if config.initial_pool_ratio is not None:
        return pool_group_ratio(config.initial_pool_ratio, groups)
    if config.typical_step is None and config.constraints:
        slots = [minimum[pg.index] for pg in groups]
    else:
        batch = config.typical_step or FALLBACK_BATCH
        rules = scratch_rules(config, registry, storage)
        slots = [
            sum(slots_for_batch(registry, group, batch, rules[group]) for group in pg.life_cycles) for pg in groups
        ]
    return bytes_ratio(slots, groups)


def bytes_ratio(slots: Sequence[int], groups: Sequence[PoolGroupConfig]) -> list[float]:
    """Each pool group's share of the bytes of ``slots`` (per pool group); equal shares when
    there are none."""
    # Bytes as doubles, multiplied and added in order: the native backend does the same float
    # operations, where the exact products could exceed 64 bits.
    weights = [float(n) * float(pg.slot_bytes) for n, pg in zip(slots, groups, strict=True)]
    total = 0.0
    for w in weights:
        total += w
    return [w / total for w in weights] if total else [1.0 / len(groups)] * len(groups)


def distribute(
    ratio: list[float], minimum: list[int], groups: list[PoolGroupConfig], grains: int, granularity: int
) -> list[int]:
    """Split ``grains`` by ratio (ascending ratio first, each taking its rounded share of what
    is left), pin any group at or below its minimum to the minimum and split again, then give
    leftover grains to groups in index order."""
    n = len(groups)
    pinned = [False] * n
    slots = [0] * n
    while True:
        budget = grains - sum(grains_for(minimum[p], groups[p].slot_sizes, granularity) for p in range(n) if pinned[p])
        free = sorted((p for p in range(n) if not pinned[p]), key=lambda p: (ratio[p], p))
        remaining = 0.0
        for p in free:
            remaining += ratio[p]
        for p in free:
            share = round(budget * ratio[p] / remaining) if remaining > 0 else 0
            share = max(0, min(share, budget))
            budget -= share
            remaining -= ratio[p]
            slots[p] = max_slots(share, groups[p].slot_sizes, granularity)
        newly = [p for p in free if slots[p] <= minimum[p]]
        for p in newly:
            pinned[p] = True
        for p in range(n):
            if pinned[p]:
                slots[p] = minimum[p]
        if not newly or all(pinned):
            break
    leftover = grains - sum(grains_for(slots[p], groups[p].slot_sizes, granularity) for p in range(n))
    for p in range(n):
        used = grains_for(slots[p], groups[p].slot_sizes, granularity)
        slots[p] = max(slots[p], max_slots(used + leftover, groups[p].slot_sizes, granularity))
        leftover -= grains_for(slots[p], groups[p].slot_sizes, granularity) - used
    return slots


class SlotCounts:
    """A cache level's effective quota, and its minimum and actual slots per pool group. Every
    level has the device level's minimum slots and ratio, with its own quota and granularity."""

    def __init__(
        self,
        config: KVCacheManagerConfig,
        registry: LifeCycleRegistry,
        storage: StorageConfig,
        level: int = 0,
        quota: int | None = None,
        ratio: Sequence[float] | None = None,
    ) -> None:
        """``quota`` overrides the tier's (a quota resize), ``ratio`` (per pool group) the
        initial one (the auto-tuner's)."""
        tier = config.local_tiers[level]
        quota = tier.quota if quota is None else quota
        self.granularity = g = tier_granularity(tier.tier, quota)
        self.min_slots = minimum = compute_min_slots(config, registry, storage)
        groups = storage.pool_groups
        # Checked before the ratio, as the native backend does.
        self.min_quota = least = min_quota(minimum, groups, g, TIER_NAMES[tier.tier])
        split = initial_ratio(config, registry, storage, minimum) if ratio is None else list(ratio)
        self.quota = max(least, ceil_div(quota, g) * g)
        self.slots = distribute(split, minimum, groups, self.quota // g, g)
