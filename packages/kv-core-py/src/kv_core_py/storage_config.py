"""How buffers are coalesced into pools and layer groups into pool groups (docs/manager.md)."""

from __future__ import annotations

from dataclasses import dataclass

from kv_api.config import KVCacheManagerConfig
from kv_api.descriptors import BufferId
from kv_core_py.life_cycles import LifeCycleRegistry


@dataclass(frozen=True)
class BufferPlacement:
    """Where one buffer lives: the ``position``-th of ``scale`` buffers of ``size`` bytes in
    each slot of pool ``pool`` of its layer group's pool group."""

    layer_group: int
    pool: int
    position: int
    scale: int
    size: int  # bytes per block, expanded
    page_size: int  # bytes per page: ``size // expansion``
    expansion: int


@dataclass(frozen=True)
class PoolGroupConfig:
    index: int
    life_cycles: tuple[int, ...]  # its layer groups, named as kv_api.PoolGroupDesc.life_cycles
    slot_sizes: tuple[int, ...]  # one per pool, descending

    @property
    def slot_bytes(self) -> int:
        return sum(self.slot_sizes)


class StorageConfig:
    """Per layer group, buffers are grouped by expanded size (first appearance order, ids in
    layer/buffer order); each group is one pool whose slot holds the group side by side. Pools
    are sorted by descending slot size (stable). Layer groups with equal slot-size lists share a
    pool group; pool groups are numbered in order of first appearance."""

    def __init__(self, config: KVCacheManagerConfig, registry: LifeCycleRegistry) -> None:
        tokens_per_block = config.tokens_per_block
        per_layer_group: list[list[tuple[int, list[tuple[BufferId, int]]]]] = [[] for _ in registry.life_cycles]
        for layer in config.layers:
            groups = per_layer_group[registry.layer_group_of[layer.layer_id]]
            for b in layer.buffers:
                expansion = tokens_per_block // b.tokens_per_block_override if b.tokens_per_block_override else 1
                size = b.size * expansion
                group = next((g for s, g in groups if s == size), None)
                if group is None:
                    group = []
                    groups.append((size, group))
                group.append((BufferId(layer.layer_id, b.role), expansion))
        self.placements: dict[BufferId, BufferPlacement] = {}
        self.pool_groups: list[PoolGroupConfig] = []
        self._layer_group_pool_group: list[int] = []
        for layer_group, groups in enumerate(per_layer_group):
            pools = sorted(groups, key=lambda g: -g[0] * len(g[1]))
            slot_sizes = tuple(size * len(ids) for size, ids in pools)
            for pool, (size, ids) in enumerate(pools):
                for position, (buffer, expansion) in enumerate(ids):
                    self.placements[buffer] = BufferPlacement(
                        layer_group, pool, position, len(ids), size, size // expansion, expansion
                    )
            match = next((pg for pg in self.pool_groups if pg.slot_sizes == slot_sizes), None)
            if match is None:
                match = PoolGroupConfig(len(self.pool_groups), (layer_group,), slot_sizes)
                self.pool_groups.append(match)
            else:
                self.pool_groups[match.index] = PoolGroupConfig(
                    match.index, (*match.life_cycles, layer_group), slot_sizes
                )
            self._layer_group_pool_group.append(match.index)

    def pool_group_of(self, layer_group: int) -> int:
        return self._layer_group_pool_group[layer_group]

    def placement(self, layer_id: int, role: str) -> BufferPlacement:
        try:
            return self.placements[BufferId(layer_id, role)]
        except KeyError:
            raise KeyError(f"no buffer {role!r} in layer {layer_id}") from None
