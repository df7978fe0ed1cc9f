"""A cache's page indices (docs/manager.md, "Page indices"): per layer group the slot of each
block's locked page, the levels of its pages, and the caller's buffers kept equal to them."""

from __future__ import annotations

from array import array
from typing import Any

from kv_api.constants import BAD_PAGE_INDEX, PageIndexMode
from kv_api.dlpack import as_buffer
from kv_core_py import poison
from kv_core_py.cache_state import CacheState


class PageIndices(CacheState):
    """The index views of ``kv_api.KVCache``; each public call takes the manager's lock."""

    def get_base_page_indices(self, layer_group: int, beam: int = 0) -> array[int]:
        """One slot id per block of the layer group, ``BAD_PAGE_INDEX`` where no page is locked."""
        poison.check()
        with self._context.lock:
            return array("i", self._index[self._check_group(layer_group, beam)])

    def get_ssm_block_base_index(self, layer_group: int) -> int:
        poison.check()
        with self._context.lock:
            checked = self._check_group(layer_group, 0)
            state = self._ssm_state[checked]
            return state.slot if state is not None and self._ssm_locked[checked] else BAD_PAGE_INDEX

    def get_page_levels(self, layer_group: int, beam: int = 0) -> array[int]:
        """Per block, the cache level of the cache's page in the layer group (-1: none)."""
        poison.check()
        with self._context.lock:
            checked = self._check_group(layer_group, beam)
            return array("i", [-1 if (p := block.pages[checked]) is None else p.level for block in self._blocks])

    def get_aggregated_page_indices(self, layer_group: int, beam: int = 0, valid_only: bool = False) -> array[int]:
        poison.check()
        with self._context.lock:
            index = self._index[self._check_group(layer_group, beam)]
            return array("i", [i for i in index if i != BAD_PAGE_INDEX] if valid_only else index)

    def set_base_page_index_buf(self, beam: int, layer_group: int, buf: Any) -> None:
        """Keep ``buf`` (1-D, writable, format 'i', at least ``num_blocks`` long; a buffer or a
        DLPack tensor such as a torch int32 tensor) updated with the layer group's page indices;
        the tail past ``num_blocks`` is -1. ``None`` detaches."""
        poison.check()
        with self._context.lock:
            checked = self._check_group(layer_group, beam)
            if buf is None:
                self._user_buffers.pop(checked, None)
                return
            view = as_buffer(buf, "buf")
            if view is None:
                raise TypeError(f"buf: expected a writable int32 buffer, got {type(buf).__name__}")
            if view.readonly or view.ndim != 1 or view.format not in ("i", "@i", "=i", "<i"):
                raise ValueError(f"buf: must be a writable 1-D buffer of format 'i' (got format {view.format!r})")
            if not view.c_contiguous:
                raise ValueError("buf: must be contiguous")
            if len(view) < len(self._blocks):
                raise ValueError(f"buf: too short ({len(view)} < {len(self._blocks)} blocks)")
            view = view.cast("B").cast("i")
            self._user_buffers[checked] = view
            self._sync_user_buffers()

    def supports_index_mode(self, mode: PageIndexMode) -> bool:
        poison.check()
        with self._context.lock:
            return PageIndexMode(mode) == PageIndexMode.PER_LAYER or not any(self._scratch_pages)

    def _sync_user_buffers(self) -> None:
        for layer_group, buf in self._user_buffers.items():
            n = len(self._blocks)
            buf[:n] = self._index[layer_group]
            for i in range(n, len(buf)):
                buf[i] = BAD_PAGE_INDEX
