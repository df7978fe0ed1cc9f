"""Life cycles: layers whose pages live and die together, and their stale block ranges."""

from __future__ import annotations

from kv_api.config import AttentionLayerConfig, KVCacheManagerConfig
from kv_api.constants import ceil_div
from kv_api.descriptors import LifeCycle


class LifeCycleRegistry:
    """Assigns life-cycle ids in order of first appearance in ``config.layers``; layers with the
    same (window, sink blocks) share one. The id doubles as the layer-group id."""

    def __init__(self, config: KVCacheManagerConfig) -> None:
        self.tokens_per_block = config.tokens_per_block
        self.life_cycles: list[LifeCycle] = []
        self.layer_life_cycle: dict[int, int] = {}
        index: dict[tuple[int | None, int], int] = {}
        for i, layer in enumerate(config.layers):
            if not isinstance(layer, AttentionLayerConfig):
                raise ValueError(f"config.layers[{i}]: SSM layers are not supported by this backend")
            window = layer.sliding_window_size
            # No window means no sinks (a count of 0 is allowed there): a plain full-attention layer.
            sinks = ceil_div(layer.num_sink_tokens or 0, self.tokens_per_block) if window is not None else 0
            key = (window, sinks)
            if key not in index:
                index[key] = len(self.life_cycles)
                self.life_cycles.append(LifeCycle(len(self.life_cycles), window, sinks, self.tokens_per_block))
            self.layer_life_cycle[layer.layer_id] = index[key]

    def stale_range(self, life_cycle: int, history: int) -> tuple[int, int]:
        """Blocks ``[begin, end)`` not needed for the next step at ``history`` tokens: the rule
        priority callbacks see too (``LifeCycle.get_stale_range``)."""
        return self.life_cycles[life_cycle].get_stale_range(history)

    def min_slots_floor(self, life_cycle: int) -> int:
        """Slots one request may need at once: a window straddles one extra block while it slides."""
        tpb = self.tokens_per_block
        windowed = [lc.num_sink_blocks + (lc.window + tpb - 2) // tpb + 1 for lc in self.life_cycles if lc.window]
        lc = self.life_cycles[life_cycle]
        if lc.window is not None:
            return lc.num_sink_blocks + (lc.window + tpb - 2) // tpb + 1
        return max(windowed, default=1)
