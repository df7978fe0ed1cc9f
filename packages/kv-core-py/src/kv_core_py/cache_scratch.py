"""A cache's sliding-window scratch (docs/manager.md, "Sliding-window scratch"): where its scratch
blocks lie at given lengths, the shared slots they take, and the switch. The rule itself (which
blocks, how many slots) is ``scratch.ScratchRule``'s."""

from __future__ import annotations

from kv_api.constants import ceil_div
from kv_api.descriptors import ScratchDesc
from kv_core_py import poison
from kv_core_py.cache_state import CacheState


class CacheScratch(CacheState):
    """The scratch part of ``KVCache``; private methods expect the manager's lock held."""

    def _scratch_range(self, layer_group: int, capacity: int, history: int) -> tuple[int, int]:
        """The layer group's scratch blocks ``[a, b)`` at these lengths (``a == b``: none)."""
        rule = self._context.scratch[layer_group]
        if rule is None or not self._scratch_on:
            return 0, 0
        return rule.range(capacity, history)

    def _scratch_need(self, layer_group: int, capacity: int, history: int) -> int:
        """Scratch slots the layer group needs at these lengths."""
        rule = self._context.scratch[layer_group]
        a, b = self._scratch_range(layer_group, capacity, history)
        return 0 if rule is None or a == b else rule.slots(b - a)

    def _check_scratch_history(self, api: str, capacity: int, history: int) -> None:
        """Scratch blocks leaving the scratch range must be stale at the new history: their data
        was never kept, so no page could take them back. ``ValueError`` otherwise (the history
        moved below ``capacity - max_rewind_len``), before anything changes."""
        if not self._scratch_on:
            return
        num_blocks = ceil_div(capacity, self._tokens_per_block)
        for layer_group in self._block_layer_groups:
            a, b = self._scratch_range(layer_group, self._capacity, self._history)
            if a == b:
                continue
            a2, b2 = self._scratch_range(layer_group, capacity, history)
            leaving = [(a, min(b, a2)), (max(a, b2), b)] if a2 < b2 else [(a, b)]
            begin, end = self._context.registry.stale_range(layer_group, history)
            for lo, hi in leaving:
                hi = min(hi, num_blocks)
                if lo < hi and (lo < begin or hi > end):
                    raise ValueError(
                        f"{api}: history_length {history} would bring back scratch blocks of layer group"
                        f" {layer_group} (their data is gone); keep it at least capacity - max_rewind_len"
                    )

    def _free_scratch(self, layer_group: int, keep: int) -> None:
        """Free the layer group's scratch slots beyond the first ``keep`` (last first)."""
        pages = self._scratch_pages[layer_group]
        while len(pages) > keep:
            page = pages.pop()
            self._context.storage.unlock(page)
            self._context.storage.unhold(page)

    @property
    def enable_swa_scratch_reuse(self) -> bool:
        poison.check()
        return self._scratch_on

    @enable_swa_scratch_reuse.setter
    def enable_swa_scratch_reuse(self, value: bool) -> None:
        poison.check()
        with self._context.lock:
            if not isinstance(value, bool):
                raise TypeError(f"enable_swa_scratch_reuse: expected a bool, got {type(value).__name__}")
            if value == self._scratch_on:
                return
            if value and self._context.swa_scratch_reuse is None:
                raise ValueError("enable_swa_scratch_reuse: the manager's config has no swa_scratch_reuse")
            # Either way the blocks of the scratch range would change hands (pages <-> scratch).
            on = [
                layer_group
                for layer_group in self._block_layer_groups
                if (rule := self._context.scratch[layer_group]) is not None
                and (r := rule.range(self._capacity, self._history))[0] < r[1]
            ]
            if on:
                raise ValueError(
                    f"enable_swa_scratch_reuse: cannot change while scratch blocks are needed (layer group {on[0]})"
                )
            self._scratch_on = value

    @property
    def has_scratch_slots(self) -> bool:
        poison.check()
        return any(self._scratch_pages)

    def get_scratch_desc(self, layer_group: int) -> ScratchDesc | None:
        poison.check()
        with self._context.lock:
            checked = self._check_group(layer_group, 0)
            pages = self._scratch_pages[checked]
            if not pages:
                return None
            a, b = self._scratch_range(checked, self._capacity, self._history)
            return ScratchDesc(range(a, b), tuple(p.slot for p in pages))
