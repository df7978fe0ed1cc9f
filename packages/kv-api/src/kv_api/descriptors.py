"""Frozen descriptions of how a manager laid out its memory (docs/manager.md, "Pools")."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from dataclasses import dataclass

from kv_api.constants import BAD_PAGE_INDEX, PageIndexMode, ceil_div

__all__ = ["BufferId", "LifeCycle", "PageIndexConverter", "PoolDesc", "PoolGroupDesc", "ScratchDesc"]


@dataclass(frozen=True, order=True)
class BufferId:
    """One buffer of one layer."""

    layer_id: int
    role: str


@dataclass(frozen=True)
class LifeCycle:
    """Layers whose pages live and die together: full attention (``window is None``), one
    sliding window with ``num_sink_blocks`` sink blocks, or (``ssm``) the state-space layers, in
    blocks of ``tokens_per_block`` tokens. ``id`` is also the layer-group id. Priority callbacks
    receive it."""

    id: int
    window: int | None
    num_sink_blocks: int
    tokens_per_block: int
    ssm: bool = False

    def get_stale_range(self, history_length: int, tokens_per_block: int | None = None) -> tuple[int, int]:
        """Blocks ``[begin, end)`` not needed for the next step at ``history_length`` tokens.

        With ``s = min(ceil(H / tpb), sink blocks)``: full attention has none (``(s, s)``); a
        window ``W`` makes ``[s, max(s, (H + 1 - W) // tpb))`` stale. The +1 is the token in
        flight at position ``H``; sink blocks are never stale. ``tokens_per_block`` defaults to
        the manager's (the reference's callers pass it). SSM layers need no block's pages, only
        the request's state: ``[0, H // tpb)`` is stale.
        """
        tpb = self.tokens_per_block if tokens_per_block is None else tokens_per_block
        if self.ssm:
            return 0, history_length // tpb
        s = min(ceil_div(history_length, tpb), self.num_sink_blocks)
        if self.window is None:
            return s, s
        return s, max(s, (history_length + 1 - self.window) // tpb)


@dataclass(frozen=True)
class PageIndexConverter:
    """Turns a cache's base page indices (slot ids) into one buffer's page indices.

    ``scale`` buffers share each slot of the buffer's pool and the buffer is the
    ``layer_offset``-th of them; one block is ``expansion`` pages of the buffer.
    ``scratch_pages_per_block``: pages of the buffer one sliding-window scratch block takes in
    the scratch slots (``KVCache.get_scratch_desc``), which a layer's scratch blocks fill back to
    back; scratch blocks' base indices are ``BAD_PAGE_INDEX`` and convert to it.
    """

    scale: int
    expansion: int
    layer_offset: int
    scratch_pages_per_block: int = 1

    def __call__(self, base_indices: Iterable[int], mode: PageIndexMode = PageIndexMode.PER_LAYER) -> list[int]:
        offset = self.layer_offset if mode == PageIndexMode.PER_LAYER else 0
        out: list[int] = []
        for base in base_indices:
            if base == BAD_PAGE_INDEX:
                out.extend([BAD_PAGE_INDEX] * self.expansion)
            else:
                first = (base * self.scale + offset) * self.expansion
                out.extend(range(first, first + self.expansion))
        return out


@dataclass(frozen=True)
class PoolDesc:
    """One pool: its pool group's ``num_slots`` slots of ``slot_size`` bytes at ``base_address``.
    A slot holds one life cycle's buffers of one block side by side; where a buffer sits is
    ``KVCacheManager.get_mem_pool_base_address`` / ``get_page_index_converter``."""

    base_address: int
    slot_size: int


@dataclass(frozen=True)
class PoolGroupDesc:
    """Pools sharing slot ids: slot ``s`` is valid in every pool of the group at once."""

    index: int
    num_slots: int
    life_cycles: tuple[int, ...]
    pools: tuple[PoolDesc, ...]


@dataclass(frozen=True)
class ScratchDesc:
    """A cache's sliding-window scratch in one layer group: the block ordinals ``range`` (this
    step's blocks that are out of the window once the step is done; their base indices are
    ``BAD_PAGE_INDEX``) and the slots they share, ``slot_ids``."""

    range: builtins.range
    slot_ids: tuple[int, ...]
