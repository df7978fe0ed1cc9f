"""Life cycles: layers whose pages live and die together, and their stale block ranges."""

from __future__ import annotations

from kv_api.config import KVCacheManagerConfig, SsmLayerConfig
from kv_api.constants import ceil_div
from kv_api.descriptors import LifeCycle


class LifeCycleRegistry:
    """Assigns life-cycle ids in order of first appearance in ``config.layers``; attention layers
    with the same (window, sink blocks) share one, and every SSM layer shares the one SSM life
    cycle. The id doubles as the layer-group id."""

    def __init__(self, config: KVCacheManagerConfig) -> None:
        self.tokens_per_block = config.tokens_per_block
        self.life_cycles: list[LifeCycle] = []
        self.layer_life_cycle: dict[int, int] = {}
        index: dict[tuple[int | None, int, bool], int] = {}
        for layer in config.layers:
            if isinstance(layer, SsmLayerConfig):
                key: tuple[int | None, int, bool] = (None, 0, True)
            else:
                window = layer.sliding_window_size
                # No window means no sinks (a count of 0 is allowed there): a plain full-attention layer.
                sinks = ceil_div(layer.num_sink_tokens or 0, self.tokens_per_block) if window is not None else 0
                key = (window, sinks, False)
            if key not in index:
                index[key] = len(self.life_cycles)
                window, sinks, ssm = key
                self.life_cycles.append(LifeCycle(len(self.life_cycles), window, sinks, self.tokens_per_block, ssm))
            self.layer_life_cycle[layer.layer_id] = index[key]
        #: Life cycles with a page per block (attention), and the SSM one (at most one).
        self.block_life_cycles = [lc.id for lc in self.life_cycles if not lc.ssm]
        self.ssm_life_cycles = [lc.id for lc in self.life_cycles if lc.ssm]

    def stale_range(self, life_cycle: int, history: int) -> tuple[int, int]:
        """Blocks ``[begin, end)`` not needed for the next step at ``history`` tokens: the rule
        priority callbacks see too (``LifeCycle.get_stale_range``)."""
        return self.life_cycles[life_cycle].get_stale_range(history)

    def min_slots_floor(self, life_cycle: int) -> int:
        """Slots one request may need at once: a window straddles one extra block while it slides;
        an SSM state is one slot."""
        tpb = self.tokens_per_block
        windowed = [lc.num_sink_blocks + (lc.window + tpb - 2) // tpb + 1 for lc in self.life_cycles if lc.window]
        lc = self.life_cycles[life_cycle]
        if lc.ssm:
            return 1
        if lc.window is not None:
            return lc.num_sink_blocks + (lc.window + tpb - 2) // tpb + 1
        return max(windowed, default=1)
