"""From a transformers model to kvcore's layout, and back to tensors.

``model_layout`` reads what kvcore must store off a model (its config and its modules):
each model layer's kind, the K/V page shape, the window, the Mamba conv/SSM state shapes.
``ModelLayout.manager_config`` turns that into a ``KVCacheManagerConfig``; ``PageViews`` views
the device level's pools (``pool_memory``) as one torch tensor per (kvcore layer, role), zero-copy:
page ``p`` of a buffer is ``views[layer, role].pages[p]`` (docs/engine.md, "Page memory as tensors").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

import kv_api

LayerKind = Literal["full", "sliding", "ssm", "hybrid", "none"]

#: transformers' ``config.layer_types`` names (``DYNAMIC_LAYER_TYPE_MAPPING``) to layer kinds.
_KINDS: dict[str, LayerKind] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "linear_attention": "ssm",
    "hybrid": "hybrid",
    "mlp": "none",
    "moe": "none",
}
KV_ROLES = ("key", "value")
SSM_ROLES = ("conv", "ssm")
#: The SSM state is float32 whatever the model's dtype (transformers' Mamba2 chunk scan).
SSM_STATE_DTYPE = torch.float32


@dataclass(frozen=True)
class ModelLayout:
    """What kvcore stores for one model, per model layer (``kinds[i]``).

    kvcore layer ids: the attention part of model layer ``i`` is ``i``; its SSM part is ``i`` for
    an SSM layer and ``len(kinds) + i`` for a hybrid layer (which carries both: kvcore layer ids
    are unique, so it needs two).
    """

    tokens_per_block: int
    kinds: tuple[LayerKind, ...]
    dtype: torch.dtype
    kv_heads: int
    head_dim: int
    window: int | None = None
    conv_shape: tuple[int, int] | None = None  # (conv_dim, kernel size)
    ssm_shape: tuple[int, int, int] | None = None  # (heads, head_dim, state size)

    @property
    def has_ssm(self) -> bool:
        return any(k in ("ssm", "hybrid") for k in self.kinds)

    def has_attention(self, i: int) -> bool:
        return self.kinds[i] in ("full", "sliding", "hybrid")

    def has_state(self, i: int) -> bool:
        return self.kinds[i] in ("ssm", "hybrid")

    def attention_layer_id(self, i: int) -> int:
        if not self.has_attention(i):
            raise ValueError(f"model layer {i} ({self.kinds[i]}) has no attention")
        return i

    def ssm_layer_id(self, i: int) -> int:
        if not self.has_state(i):
            raise ValueError(f"model layer {i} ({self.kinds[i]}) has no SSM state")
        return len(self.kinds) + i if self.kinds[i] == "hybrid" else i

    def page_shape(self, role: str) -> tuple[int, ...]:
        """A page's tensor shape: K/V token-major ``(tpb, kv_heads, head_dim)`` (one token's
        write is one row); conv ``(conv_dim, K)``; ssm ``(heads, head_dim, state)``."""
        if role in KV_ROLES:
            return (self.tokens_per_block, self.kv_heads, self.head_dim)
        shape = self.conv_shape if role == "conv" else self.ssm_shape if role == "ssm" else None
        if shape is None:
            raise ValueError(f"no page shape for role {role!r}")
        return shape

    def role_dtype(self, role: str) -> torch.dtype:
        return SSM_STATE_DTYPE if role == "ssm" else self.dtype

    def buffer_bytes(self, role: str) -> int:
        n = 1
        for d in self.page_shape(role):
            n *= d
        return n * self.role_dtype(role).itemsize

    def layer_configs(self) -> list[kv_api.LayerConfig]:
        """One kvcore layer per attention part and per SSM part; none for mlp/moe layers."""
        kv = [kv_api.BufferConfig(r, self.buffer_bytes(r)) for r in KV_ROLES]
        layers: list[kv_api.LayerConfig] = []
        for i, kind in enumerate(self.kinds):
            if self.has_attention(i):
                window = self.window if kind == "sliding" else None
                layers.append(kv_api.AttentionLayerConfig(i, kv, sliding_window_size=window))
        for i in range(len(self.kinds)):
            if self.has_state(i):
                ssm = [kv_api.BufferConfig(r, self.buffer_bytes(r)) for r in SSM_ROLES]
                layers.append(kv_api.SsmLayerConfig(self.ssm_layer_id(i), ssm))
        return layers

    def manager_config(self, tiers: Sequence[kv_api.CacheTierConfig]) -> kv_api.KVCacheManagerConfig:
        """The manager's config; SSM layers need ``commit_min_snapshot``."""
        return kv_api.KVCacheManagerConfig(
            tokens_per_block=self.tokens_per_block,
            cache_tiers=list(tiers),
            layers=self.layer_configs(),
            commit_min_snapshot=self.has_ssm,
        )


def _layer_kinds(config: Any) -> tuple[LayerKind, ...]:
    n = int(config.num_hidden_layers)
    types = getattr(config, "layer_types", None)
    if types is None:  # Llama, Mistral: one kind for every layer
        sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
        types = ["sliding_attention" if sliding else "full_attention"] * n
    unknown = sorted({t for t in types if t not in _KINDS})
    if unknown:
        raise ValueError(f"unsupported layer types {unknown} (supported: {sorted(_KINDS)})")
    return tuple(_KINDS[t] for t in types)


def _int_attr(module: torch.nn.Module, name: str) -> int:
    value: Any = getattr(module, name)
    return int(value)


def _mamba_shapes(model: torch.nn.Module) -> tuple[tuple[int, int] | None, tuple[int, int, int] | None]:
    """Conv and SSM state shapes of the model's Mamba mixers, read off the first one (the config
    names differ per model; every transformers Mamba2 mixer has these attributes)."""
    for module in model.modules():
        if hasattr(module, "conv1d") and hasattr(module, "A_log"):
            conv = (_int_attr(module, "conv_dim"), _int_attr(module, "conv_kernel_size"))
            ssm = tuple(_int_attr(module, a) for a in ("num_heads", "head_dim", "ssm_state_size"))
            return conv, (ssm[0], ssm[1], ssm[2])
    return None, None


def _attention_shape(model: torch.nn.Module, config: Any) -> tuple[int, int]:
    """(kv_heads, head_dim), off the first attention module (Zamba2's head_dim is not the
    config's hidden/heads), else the config."""
    for module in model.modules():
        k_proj = getattr(module, "k_proj", None)
        head_dim = getattr(module, "head_dim", None)
        if isinstance(k_proj, torch.nn.Linear) and isinstance(head_dim, int):
            return k_proj.out_features // head_dim, head_dim
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return int(getattr(config, "num_key_value_heads", None) or heads), int(head_dim)


def model_layout(model: torch.nn.Module, tokens_per_block: int) -> ModelLayout:
    """The layout of ``model`` (a transformers causal LM) at ``tokens_per_block``."""
    config = model.config
    kinds = _layer_kinds(config)
    kv_heads, head_dim = _attention_shape(model, config)
    conv, ssm = _mamba_shapes(model)
    if any(k in ("ssm", "hybrid") for k in kinds) and (conv is None or ssm is None):
        raise ValueError("the config names Mamba layers but the model has no Mamba mixer")
    window = getattr(config, "sliding_window", None) if "sliding" in kinds else None
    dtype = next(model.parameters()).dtype
    return ModelLayout(tokens_per_block, kinds, dtype, kv_heads, head_dim, window, conv, ssm)


@dataclass(frozen=True)
class BufferView:
    """One (kvcore layer, role) buffer of the device level: ``pages[p]`` is page ``p``."""

    pages: torch.Tensor  # [num_pages, *page_shape], over pool_memory
    converter: kv_api.PageIndexConverter

    def page_ids(self, slots: torch.Tensor) -> torch.Tensor:
        """The buffer's page ids (int64) of base slot ids (an int32 or int64 tensor), by kvcore's
        converter (``convert_into``); -1 stays -1."""
        out = torch.empty(slots.numel() * self.converter.expansion, dtype=torch.int64)
        self.converter.convert_into(slots, out)
        return out


class PageViews:
    """Zero-copy tensors over the device level's pools, per (kvcore layer, role). ``refresh()``
    rebuilds them when the manager's ``layout_version`` moved (a device resize or ``adjust()``
    remapped the pools)."""

    def __init__(self, manager: kv_api.KVCacheManager, layout: ModelLayout) -> None:
        self.manager = manager
        self.layout = layout
        self.group_of = {lid: manager.get_layer_group_id(lid) for lid in manager.layer_ids}
        ssm = {layout.ssm_layer_id(i) for i in range(len(layout.kinds)) if layout.has_state(i)}
        #: Layer groups of attention layers and of SSM layers.
        self.attention_groups = sorted({g for lid, g in self.group_of.items() if lid not in ssm})
        self.ssm_groups = sorted({g for lid, g in self.group_of.items() if lid in ssm})
        self._views: dict[tuple[int, str], BufferView] = {}
        self.version = -1
        self.refresh()

    def __getitem__(self, key: tuple[int, str]) -> BufferView:
        return self._views[key]

    def refresh(self) -> None:
        """The views again, if the pools may have moved since they were taken."""
        version = self.manager.layout_version
        if version != self.version:
            self.rebuild()
            self.version = version

    def rebuild(self) -> None:
        views: dict[tuple[int, str], BufferView] = {}
        for layer in self.manager.init_config.layers:
            for buf in layer.buffers:
                views[(layer.layer_id, buf.role)] = self._view(layer.layer_id, buf.role)
        self._views = views

    def _view(self, layer_id: int, role: str) -> BufferView:
        """Page ``p`` is bytes ``[p * stride, (p + 1) * stride)`` of the buffer's pool
        (docs/manager.md, "Page addresses")."""
        m = self.manager
        loc = m.get_buffer_location(layer_id, role)
        stride = loc.page_stride
        if stride != self.layout.buffer_bytes(role):
            raise ValueError(f"layer {layer_id} {role}: page stride {stride} != buffer size")
        raw = torch.frombuffer(m.pool_memory(loc.pool_group, loc.pool), dtype=torch.uint8)
        n = raw.numel() // stride
        dtype = self.layout.role_dtype(role)
        pages = raw[: n * stride].view(n, stride).view(dtype).view(n, *self.layout.page_shape(role))
        return BufferView(pages, m.get_page_index_converter(layer_id, role))
