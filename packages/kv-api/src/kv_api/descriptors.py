"""Frozen descriptions of how a manager laid out its memory (docs/manager.md, "Pools")."""

from __future__ import annotations

import builtins
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from kv_api.constants import BAD_PAGE_INDEX, PageIndexMode, ceil_div
from kv_api.dlpack import as_buffer

__all__ = [
    "BufferId",
    "BufferLocation",
    "LifeCycle",
    "PageIndexConverter",
    "PoolDesc",
    "PoolGroupDesc",
    "ScratchDesc",
]


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

    def convert_into(self, base_indices: Any, out: Any, mode: PageIndexMode = PageIndexMode.PER_LAYER) -> int:
        """``self(base_indices, mode)`` written into ``out`` instead of a new list; returns how
        many indices it wrote (``expansion`` per base index). Both are 1-D integer buffers or
        DLPack tensors (a torch tensor: int32 or int64), viewed in place; ``out`` must be
        writable and hold them all (``ValueError``), its tail is left as it was."""
        src = _index_view("base_indices", base_indices)
        dst = _index_view("out", out)
        if dst.readonly:
            raise ValueError("out: must be writable")
        n = len(src) * self.expansion
        if len(dst) < n:
            raise ValueError(f"out: too short ({len(dst)} < {n} page indices)")
        dst[:n] = array(dst.format, self(src.tolist(), mode))
        return n


def _index_view(name: str, obj: Any) -> memoryview:
    """``obj`` as a 1-D contiguous memoryview of native int32 or int64."""
    view = as_buffer(obj, name)
    if view is None:
        raise TypeError(f"{name}: expected an integer buffer or tensor, got {type(obj).__name__}")
    fmt = view.format.lstrip("@=")
    if view.ndim != 1 or fmt not in ("i", "l", "q") or view.itemsize not in (4, 8):
        raise ValueError(f"{name}: must be a 1-D int32 or int64 buffer (got format {view.format!r})")
    if not view.c_contiguous:
        raise ValueError(f"{name}: must be contiguous")
    native: memoryview = view.cast("B").cast(cast(Any, fmt))
    return native


@dataclass(frozen=True)
class BufferLocation:
    """Where one (layer, role) buffer's pages are (``KVCacheManager.get_buffer_location``): in
    pool ``pool`` of pool group ``pool_group``. Its page ``p`` (a PER_LAYER page index, from
    ``get_page_index_converter``) is bytes ``[p * page_stride, (p + 1) * page_stride)`` of
    ``pool_memory(pool_group, pool)``, i.e. at ``get_mem_pool_base_address(layer, role) + p *
    page_stride`` (docs/manager.md, "Page addresses")."""

    pool_group: int
    pool: int
    page_stride: int


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
