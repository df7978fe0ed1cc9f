"""Sliding-window scratch reuse (docs/manager.md, "Sliding-window scratch"): which blocks of a
step are scratch, and how many shared slots they take."""

from __future__ import annotations

from dataclasses import dataclass

from kv_api.config import KVCacheManagerConfig, SsmLayerConfig
from kv_api.constants import ceil_div
from kv_api.descriptors import LifeCycle
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.storage_config import StorageConfig


@dataclass(frozen=True)
class ScratchRule:
    """One sliding-window layer group's scratch. ``layer_bytes / slot_bytes`` is
    ``slot_util_frac_max``: the largest share of the layer group's slot one of its layers takes
    (the layer's buffers' bytes per block, expanded, over the pool group's slot bytes), kept as
    two integers so both backends round alike."""

    life_cycle: LifeCycle
    max_rewind_len: int
    layer_bytes: int
    slot_bytes: int

    def range(self, capacity: int, history: int) -> tuple[int, int]:
        """``stale(max(0, capacity - max_rewind_len)) ∩ [ceil(history / tokens_per_block),
        ceil(capacity / tokens_per_block))``: this step's blocks that are out of the window once the
        step is done, even if a later step rewinds the history by up to ``max_rewind_len`` tokens.
        Empty as ``(lo, lo)``."""
        tokens_per_block = self.life_cycle.tokens_per_block
        begin, end = self.life_cycle.get_stale_range(max(0, capacity - self.max_rewind_len))
        lo = max(begin, ceil_div(history, tokens_per_block))
        return lo, max(lo, min(end, ceil_div(capacity, tokens_per_block)))

    def slots(self, num_blocks: int) -> int:
        """``ceil(num_blocks * slot_util_frac_max)``: the layers run one after another, so one
        layer's share of ``num_blocks`` blocks is all the scratch holds at once."""
        if self.layer_bytes == 0:  # layers without buffers: nothing to hold (and no slot bytes)
            return 0
        return ceil_div(num_blocks * self.layer_bytes, self.slot_bytes)


def scratch_rules(
    config: KVCacheManagerConfig, registry: LifeCycleRegistry, storage: StorageConfig
) -> list[ScratchRule | None]:
    """Per layer group, its scratch rule: sliding-window layer groups when the config has
    ``swa_scratch_reuse``, else None (full attention is never stale, SSM has no blocks)."""
    reuse = config.swa_scratch_reuse
    if reuse is None:
        return [None] * len(registry.life_cycles)
    tokens_per_block = config.tokens_per_block
    layer_bytes = [0] * len(registry.life_cycles)
    for layer in config.layers:
        if isinstance(layer, SsmLayerConfig):
            continue
        group = registry.layer_group_of[layer.layer_id]
        size = sum(
            b.size * (tokens_per_block // b.tokens_per_block_override if b.tokens_per_block_override else 1)
            for b in layer.buffers
        )
        layer_bytes[group] = max(layer_bytes[group], size)
    rules: list[ScratchRule | None] = []
    for life_cycle, kind in zip(registry.life_cycles, registry.kinds, strict=True):
        if not kind.has_scratch:
            rules.append(None)
            continue
        slot_bytes = storage.pool_groups[storage.pool_group_of(life_cycle.id)].slot_bytes
        rules.append(ScratchRule(life_cycle, reuse.max_rewind_len, layer_bytes[life_cycle.id], slot_bytes))
    return rules
