"""Layer groups (layers whose pages live and die together), their life cycles and stale block ranges."""

from __future__ import annotations

from kv_api.config import KVCacheManagerConfig, SsmLayerConfig
from kv_api.constants import ceil_div
from kv_api.descriptors import LifeCycle
from kv_core_py.life_cycle_kinds import LifeCycleKind, SlidingWindow, kind_of


class LifeCycleRegistry:
    """Assigns layer groups in order of first appearance in ``config.layers``; attention layers
    with the same (window, sink blocks) share one, and every SSM layer shares the one SSM layer
    group. A group's life cycle has the group as its id (``LifeCycle.id``)."""

    def __init__(self, config: KVCacheManagerConfig) -> None:
        self.tokens_per_block = config.tokens_per_block
        self.life_cycles: list[LifeCycle] = []
        self.layer_group_of: dict[int, int] = {}
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
            self.layer_group_of[layer.layer_id] = index[key]
        #: Per layer group, its life cycle's kind: what differs between full attention, windows and SSM.
        self.kinds: list[LifeCycleKind] = [kind_of(life) for life in self.life_cycles]
        #: Layer groups with a page per block (attention), and the SSM one (at most one).
        self.block_layer_groups = [k.life_cycle.id for k in self.kinds if k.has_block_pages]
        self.ssm_layer_groups = [k.life_cycle.id for k in self.kinds if not k.has_block_pages]

    def stale_range(self, layer_group: int, history: int) -> tuple[int, int]:
        """Blocks ``[begin, end)`` not needed for the next step at ``history`` tokens: the rule
        priority callbacks see too (``LifeCycle.get_stale_range``)."""
        return self.life_cycles[layer_group].get_stale_range(history)

    def min_slots_floor(self, layer_group: int) -> int:
        """Slots one request may need at once (``LifeCycleKind.slots_floor``)."""
        windows = [k.window_floor for k in self.kinds if isinstance(k, SlidingWindow)]
        return self.kinds[layer_group].slots_floor(windows)
