"""A ``transformers.Cache`` whose keys, values and Mamba states are kvcore's pages.

One ``PagedCache`` serves one request for one forward: it is built with the request's
``KVCache``, its base page indices (int32 tensors per attention layer group that kvcore keeps
current: a commit may rebase a block, a resume may onboard pages into other slots, a resize
slides the window) and ``history`` (H, the tokens computed before this forward).

- ``update`` writes the forward's new K/V for positions ``[H, H+q)`` into the pages and returns
  the sequence's K/V gathered from its pages (a transient tensor; nothing persists off the pages).
- The conv/SSM getters return zero-copy views of the request's state slot, which the model's
  decode path updates in place. At ``H == 0`` they return None: a recycled slot is not zeroed, and
  None is transformers' "no previous state".
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

import kv_api
from kv_engine.layout import KV_ROLES, PageViews


class PagedCache(Cache):
    """The cache of one request for one forward (batch size 1)."""

    def __init__(
        self, views: PageViews, kv_cache: kv_api.KVCache, slots: dict[int, torch.Tensor], history: int
    ) -> None:
        # Cache.__init__ would build per-layer tensor caches; this one keeps none.
        self.views = views
        self.layout = views.layout
        self.kv_cache = kv_cache
        self.history = history
        self.layers = cast(Any, [None] * len(self.layout.kinds))
        self.offloading = False
        self.layer_class_to_replicate = None
        self._slots = slots
        self._state_slots = {g: kv_cache.get_ssm_block_base_index(g) for g in views.ssm_groups}

    # -- what transformers asks of a cache --------------------------------------------------------

    @property
    def is_sliding(self) -> list[bool]:
        return [k == "sliding" for k in self.layout.kinds]

    @property
    def is_linear(self) -> list[bool]:
        return [k == "ssm" for k in self.layout.kinds]

    @property
    def is_dummy(self) -> list[bool]:
        return [k == "none" for k in self.layout.kinds]

    @property
    def is_compileable(self) -> bool:
        return False

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.history

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.history

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of what ``update`` returns for this layer: everything for full
        attention, from the first non-stale block on for a window layer (the mask hides the rest)."""
        offset = self._first_block(layer_idx) * self.layout.tokens_per_block
        return self.history + query_length - offset, offset

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return self.history > 0

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    # -- keys and values --------------------------------------------------------------------------

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[1, Hkv, q, D]`` K/V at positions ``[H, H+q)``; return the layer's K/V for
        ``[kv_offset, H+q)`` as ``[1, Hkv, T, D]``."""
        if key_states.shape[0] != 1:
            raise ValueError(f"PagedCache serves one request (batch 1), got batch {key_states.shape[0]}")
        lid = self.layout.attention_layer_id(layer_idx)
        tpb = self.layout.tokens_per_block
        end = self.history + key_states.shape[2]
        written = torch.arange(self.history, end)
        read = torch.arange(self._first_block(layer_idx) * tpb, end)
        out = []
        for role, new in zip(KV_ROLES, (key_states, value_states), strict=True):
            view = self.views[(lid, role)]
            pages = view.page_ids(self._layer_slots(lid))
            flat = view.pages.view(-1, *view.pages.shape[2:])  # [num_pages * tpb, Hkv, D]
            flat.index_copy_(0, self._rows(pages, written), new[0].transpose(0, 1))
            gathered = flat.index_select(0, self._rows(pages, read))
            out.append(gathered.transpose(0, 1).unsqueeze(0).contiguous())
        return out[0], out[1]

    def _rows(self, pages: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rows of the flat page tensor holding ``positions``: page * tpb + position % tpb."""
        tpb = self.layout.tokens_per_block
        blocks = positions // tpb
        if int(blocks[-1]) >= pages.numel():
            raise RuntimeError(f"position {int(positions[-1])} is beyond the cache's capacity")
        ids = pages[blocks]
        if bool((ids < 0).any()):
            raise RuntimeError("a page the forward needs is not locked (page index -1)")
        return ids * tpb + positions % tpb

    def slots(self, group: int) -> torch.Tensor:
        """The base page indices (slots) of an attention layer group, int32; -1: no page."""
        return self._slots[group]

    def _layer_slots(self, layer_id: int) -> torch.Tensor:
        return self._slots[self.views.group_of[layer_id]]

    def _first_block(self, layer_idx: int) -> int:
        """The first block a layer reads: 0, or for a window layer the first one holding a page
        (stale blocks read -1); it must not lie past the first token the window needs."""
        if self.layout.kinds[layer_idx] != "sliding" or self.layout.window is None:
            return 0
        slots = self._layer_slots(self.layout.attention_layer_id(layer_idx))
        valid = (slots >= 0).nonzero()
        first = int(valid[0]) if valid.numel() else 0
        needed = max(0, self.history + 1 - self.layout.window)
        if first * self.layout.tokens_per_block > needed:
            raise RuntimeError(f"window layer {layer_idx}: block {first} is past token {needed} the window needs")
        return first

    # -- Mamba conv and SSM states ----------------------------------------------------------------

    def _state(self, layer_idx: int, role: str) -> torch.Tensor:
        """A zero-copy ``[1, *state_shape]`` view of the request's state slot."""
        lid = self.layout.ssm_layer_id(layer_idx)
        slot = self._state_slots[self.views.group_of[lid]]
        if slot < 0:
            raise RuntimeError(f"layer {layer_idx}: no SSM state slot (is the cache suspended?)")
        view = self.views[(lid, role)]
        page = int(view.page_ids(torch.tensor([slot]))[0])
        return view.pages[page].unsqueeze(0)

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._state(layer_idx, "conv") if self.history else None

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._state(layer_idx, "ssm") if self.history else None

    def update_conv_state(
        self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Returns the conv input with its left context (the stored state, or zero padding at
        H == 0) and stores its last K columns, as transformers' ``LinearAttentionLayer`` does."""
        state = self._state(layer_idx, "conv")
        k = state.shape[-1]
        if self.history:
            full = torch.cat([state, conv_states], dim=-1)
        elif conv_states.shape[-1] < k:
            full = F.pad(conv_states, (k - conv_states.shape[-1], 0))
        else:
            full = conv_states
        state.copy_(full[..., -k:])
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        state = self._state(layer_idx, "ssm")
        state.copy_(recurrent_states)
        return state
