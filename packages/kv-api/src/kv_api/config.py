"""Configuration dataclasses. Validation raises ``ValueError``/``TypeError`` naming the field.

All configs are frozen; sequences are stored as tuples so a config can be shared and hashed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from kv_api._check import as_str, int_in_range, unit_interval
from kv_api.block_store import BlockStore
from kv_api.constants import (
    BUFFER_SIZE_LIMIT,
    DEFAULT_KEY_FORMAT,
    GHOST_RECORD_LIMIT,
    KEY_FORMATS,
    LAYER_ID_LIMIT,
    TOKEN_LIMIT,
    TOKENS_PER_BLOCK_LIMIT,
    CacheTier,
)

__all__ = [
    "AttentionLayerConfig",
    "BatchDesc",
    "BufferConfig",
    "CacheTierConfig",
    "DiskCacheTierConfig",
    "GpuCacheTierConfig",
    "HostCacheTierConfig",
    "KVCacheDesc",
    "KVCacheManagerConfig",
    "LayerConfig",
    "RemoteCacheTierConfig",
    "SsmLayerConfig",
    "SwaScratchReuseConfig",
]


def _tuple_of(where: str, value: Any, kind: type | tuple[type, ...]) -> tuple[Any, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{where}: expected a sequence, got {type(value).__name__}")
    items = tuple(value)
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise TypeError(f"{where}[{i}]: expected {names}, got {type(item).__name__}")
    return items


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


#: Quotas are byte counts below 2**63: sizes and file offsets are signed 64-bit (ssize_t, off_t),
#: and every backend then computes slot counts without overflow.
QUOTA_LIMIT = 1 << 63


@dataclass(frozen=True)
class GpuCacheTierConfig:
    """The device tier (host memory on a CPU-only machine). ``quota`` in bytes, in [1, 2**63)."""

    quota: int

    tier = CacheTier.GPU_MEM

    def __post_init__(self) -> None:
        _set(self, "quota", int_in_range("GpuCacheTierConfig.quota", self.quota, 1, QUOTA_LIMIT))


@dataclass(frozen=True)
class HostCacheTierConfig:
    """The host-memory tier. ``quota`` in bytes, in [1, 2**63)."""

    quota: int

    tier = CacheTier.HOST_MEM

    def __post_init__(self) -> None:
        _set(self, "quota", int_in_range("HostCacheTierConfig.quota", self.quota, 1, QUOTA_LIMIT))


@dataclass(frozen=True)
class DiskCacheTierConfig:
    """The disk tier: files under ``path``, an existing directory. ``quota`` in bytes, in [1, 2**63)."""

    quota: int
    path: str

    tier = CacheTier.DISK

    def __post_init__(self) -> None:
        _set(self, "quota", int_in_range("DiskCacheTierConfig.quota", self.quota, 1, QUOTA_LIMIT))
        if not isinstance(self.path, (str, os.PathLike)):
            raise TypeError(f"DiskCacheTierConfig.path: expected a path, got {type(self.path).__name__}")
        path = os.fspath(self.path)
        if not os.path.isdir(path):
            raise ValueError(f"DiskCacheTierConfig.path: must be an existing directory (got {path!r})")
        _set(self, "path", path)


@dataclass(frozen=True, eq=False)
class RemoteCacheTierConfig:
    """The remote tier below the last local one (docs/store.md): blocks a match does not find
    locally are looked up in ``store`` and brought into the last local level; committed full
    blocks are written to it. ``model_id`` and ``revision`` name the model in every store key
    (with a fingerprint of the layout), so managers of other models never read each other's
    values. Compared by identity: two configs naming one store are still two tiers."""

    store: BlockStore
    model_id: str
    revision: str = ""

    tier = CacheTier.REMOTE

    def __post_init__(self) -> None:
        if not isinstance(self.store, BlockStore):
            raise TypeError(
                f"RemoteCacheTierConfig.store: expected a kv_api.BlockStore, got {type(self.store).__name__}"
            )
        for name in ("model_id", "revision"):
            value = as_str(f"RemoteCacheTierConfig.{name}", getattr(self, name))
            if any(c in value for c in ":\0") or not value.isprintable():
                raise ValueError(f"RemoteCacheTierConfig.{name}: must be printable without ':' (got {value!r})")
        if not self.model_id:
            raise ValueError("RemoteCacheTierConfig.model_id: must be non-empty")


CacheTierConfig: TypeAlias = GpuCacheTierConfig | HostCacheTierConfig | DiskCacheTierConfig | RemoteCacheTierConfig


@dataclass(frozen=True)
class BufferConfig:
    """One buffer of a layer: ``size`` bytes per block for ``role`` (e.g. "key", "value").

    ``tokens_per_block_override`` stores the buffer at a finer block size; it must divide the
    manager's ``tokens_per_block`` (checked by ``KVCacheManagerConfig``).
    """

    role: str
    size: int
    tokens_per_block_override: int | None = None

    def __post_init__(self) -> None:
        if not as_str("BufferConfig.role", self.role):
            raise ValueError("BufferConfig.role: must be non-empty")
        _set(self, "size", int_in_range("BufferConfig.size", self.size, 1, BUFFER_SIZE_LIMIT))
        if self.tokens_per_block_override is not None:
            _set(
                self,
                "tokens_per_block_override",
                int_in_range(
                    "BufferConfig.tokens_per_block_override", self.tokens_per_block_override, 1, TOKENS_PER_BLOCK_LIMIT
                ),
            )


def _buffers(where: str, value: Any) -> tuple[BufferConfig, ...]:
    buffers = _tuple_of(f"{where}.buffers", value, BufferConfig)
    if not buffers:
        raise ValueError(f"{where}.buffers: must not be empty")
    roles = [b.role for b in buffers]
    if len(set(roles)) != len(roles):
        raise ValueError(f"{where}.buffers: roles must be unique (got {roles})")
    return buffers


@dataclass(frozen=True)
class AttentionLayerConfig:
    """An attention layer; a ``sliding_window_size`` makes it windowed, with optional sinks.

    ``num_sink_tokens`` of None or 0 means no sinks; a positive count needs a window.
    """

    layer_id: int
    buffers: Sequence[BufferConfig]
    sliding_window_size: int | None = None
    num_sink_tokens: int | None = None

    def __post_init__(self) -> None:
        _set(self, "layer_id", int_in_range("AttentionLayerConfig.layer_id", self.layer_id, 0, LAYER_ID_LIMIT))
        _set(self, "buffers", _buffers("AttentionLayerConfig", self.buffers))
        if self.sliding_window_size is not None:
            _set(
                self,
                "sliding_window_size",
                int_in_range("AttentionLayerConfig.sliding_window_size", self.sliding_window_size, 1, TOKEN_LIMIT),
            )
        if self.num_sink_tokens is not None:
            sinks = int_in_range("AttentionLayerConfig.num_sink_tokens", self.num_sink_tokens, 0, TOKEN_LIMIT)
            # Zero sinks are no sinks (the same life cycle as leaving them out), so only a
            # positive count needs a window.
            if sinks and self.sliding_window_size is None:
                raise ValueError("AttentionLayerConfig.num_sink_tokens: a positive count requires sliding_window_size")
            _set(self, "num_sink_tokens", sinks)


@dataclass(frozen=True)
class SsmLayerConfig:
    """A state-space layer: one state per request, no per-block overrides."""

    layer_id: int
    buffers: Sequence[BufferConfig]

    def __post_init__(self) -> None:
        _set(self, "layer_id", int_in_range("SsmLayerConfig.layer_id", self.layer_id, 0, LAYER_ID_LIMIT))
        _set(self, "buffers", _buffers("SsmLayerConfig", self.buffers))
        for b in self.buffers:
            if b.tokens_per_block_override is not None:
                raise ValueError("SsmLayerConfig.buffers: tokens_per_block_override is not allowed for SSM layers")


LayerConfig: TypeAlias = AttentionLayerConfig | SsmLayerConfig


@dataclass(frozen=True)
class KVCacheDesc:
    """A request's shape, for sizing: ``history_length <= capacity``."""

    capacity: int
    history_length: int

    def __post_init__(self) -> None:
        _set(self, "capacity", int_in_range("KVCacheDesc.capacity", self.capacity, 0, TOKEN_LIMIT))
        _set(
            self,
            "history_length",
            int_in_range("KVCacheDesc.history_length", self.history_length, 0, self.capacity + 1),
        )


@dataclass(frozen=True)
class BatchDesc:
    """A batch of requests that must fit at once (a sizing constraint)."""

    kv_caches: Sequence[KVCacheDesc]
    system_prompt_length: int = 0

    def __post_init__(self) -> None:
        _set(self, "kv_caches", _tuple_of("BatchDesc.kv_caches", self.kv_caches, KVCacheDesc))
        _set(
            self,
            "system_prompt_length",
            int_in_range("BatchDesc.system_prompt_length", self.system_prompt_length, 0, TOKEN_LIMIT),
        )


@dataclass(frozen=True)
class SwaScratchReuseConfig:
    """Sliding-window scratch reuse (docs/manager.md, "Sliding-window scratch"): blocks of a
    step's new tokens that are out of the window once the step is done share a few scratch slots
    instead of a page each. ``max_rewind_len``: how far a later step may move the history back
    below the capacity (rewound draft tokens)."""

    max_rewind_len: int = 0

    def __post_init__(self) -> None:
        _set(
            self,
            "max_rewind_len",
            int_in_range("SwaScratchReuseConfig.max_rewind_len", self.max_rewind_len, 0, TOKEN_LIMIT),
        )


_TIER_ORDER = {CacheTier.GPU_MEM: 0, CacheTier.HOST_MEM: 1, CacheTier.DISK: 2, CacheTier.REMOTE: 3}


@dataclass(frozen=True)
class KVCacheManagerConfig:
    """Everything a manager is built from. See docs/architecture.md for each knob."""

    tokens_per_block: int
    cache_tiers: Sequence[CacheTierConfig]
    layers: Sequence[LayerConfig]
    max_util_for_resume: float = 0.97
    enable_partial_reuse: bool = True
    reuse_match_backoff: int = 0
    constraints: Sequence[BatchDesc] = field(default_factory=tuple)
    typical_step: BatchDesc | None = None
    initial_pool_ratio: Sequence[float] | None = None
    commit_min_snapshot: bool = False
    swa_scratch_reuse: SwaScratchReuseConfig | None = None
    enable_stats: bool = True
    text_only: bool = False
    key_format: str = DEFAULT_KEY_FORMAT
    # Commit pool memory as slots are handed out (docs/manager.md, "Memory is reserved, then
    # committed"); False for a manager whose pages are never written, as a replay's.
    populate_memory: bool = True
    # Miss attribution (docs/manager.md, "Why a prompt missed").
    reuse_report: bool = True
    ghost_record_blocks: int = 65536
    reuse_report_other_scope: bool = False
    # The auto-tuner (docs/manager.md, "Rebalancing").
    rebalance_min_sampled_kv_caches: int = 2000
    rebalance_cooldown_secs: float = 120
    rebalance_target_ratio_update_interval: int = 100
    rebalance_ratio_threshold: float = 1.25
    rebalance_moving_average_decay: float = 0.9999

    def __post_init__(self) -> None:
        w = "KVCacheManagerConfig"
        tpb = int_in_range(f"{w}.tokens_per_block", self.tokens_per_block, 1, TOKENS_PER_BLOCK_LIMIT)
        _set(self, "tokens_per_block", tpb)

        tiers = _tuple_of(
            f"{w}.cache_tiers",
            self.cache_tiers,
            (GpuCacheTierConfig, HostCacheTierConfig, DiskCacheTierConfig, RemoteCacheTierConfig),
        )
        if not tiers or not isinstance(tiers[0], GpuCacheTierConfig):
            raise ValueError(f"{w}.cache_tiers: the first tier must be a GpuCacheTierConfig")
        order = [_TIER_ORDER[t.tier] for t in tiers]
        if order != sorted(set(order)):
            raise ValueError(f"{w}.cache_tiers: tiers must be distinct and ordered GPU, host, disk, remote")
        _set(self, "cache_tiers", tiers)

        layers = _tuple_of(f"{w}.layers", self.layers, (AttentionLayerConfig, SsmLayerConfig))
        if not layers:
            raise ValueError(f"{w}.layers: must not be empty")
        ids = [layer.layer_id for layer in layers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{w}.layers: layer ids must be unique (got {ids})")
        for i, layer in enumerate(layers):
            for b in layer.buffers:
                o = b.tokens_per_block_override
                if o is not None and tpb % o != 0:
                    raise ValueError(
                        f"{w}.layers[{i}]: tokens_per_block_override {o} must divide tokens_per_block {tpb}"
                    )
            if isinstance(layer, SsmLayerConfig) and not self.commit_min_snapshot:
                raise ValueError(f"{w}.layers[{i}]: SSM layers require commit_min_snapshot=True")
        block = sum(
            b.size * (tpb // b.tokens_per_block_override if b.tokens_per_block_override else 1)
            for layer in layers
            for b in layer.buffers
        )
        if block >= QUOTA_LIMIT:  # no quota holds one slot, and a slot size must fit 64 bits
            raise ValueError(f"{w}.layers: one block of every layer's buffers needs 2**63 bytes or more")
        _set(self, "layers", layers)

        _set(self, "max_util_for_resume", unit_interval(f"{w}.max_util_for_resume", self.max_util_for_resume))
        flags = ("enable_partial_reuse", "commit_min_snapshot", "enable_stats", "text_only", "reuse_report")
        for flag in (*flags, "reuse_report_other_scope", "populate_memory"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{w}.{flag}: expected a bool, got {type(getattr(self, flag)).__name__}")
        if as_str(f"{w}.key_format", self.key_format) not in KEY_FORMATS:
            raise ValueError(f"{w}.key_format: unknown {self.key_format!r} (expected one of {', '.join(KEY_FORMATS)})")
        _set(
            self,
            "reuse_match_backoff",
            int_in_range(f"{w}.reuse_match_backoff", self.reuse_match_backoff, 0, TOKEN_LIMIT),
        )
        _set(
            self,
            "ghost_record_blocks",
            int_in_range(f"{w}.ghost_record_blocks", self.ghost_record_blocks, 0, GHOST_RECORD_LIMIT),
        )
        _set(self, "constraints", _tuple_of(f"{w}.constraints", self.constraints, BatchDesc))
        if self.swa_scratch_reuse is not None and not isinstance(self.swa_scratch_reuse, SwaScratchReuseConfig):
            raise TypeError(f"{w}.swa_scratch_reuse: expected a SwaScratchReuseConfig or None")
        if self.typical_step is not None and not isinstance(self.typical_step, BatchDesc):
            raise TypeError(f"{w}.typical_step: expected a BatchDesc or None")
        if self.initial_pool_ratio is not None:
            # One entry per layer group; the backends check the length against their layer groups.
            # Messages carry the reference's phrases, so code matching them keeps working.
            where = f"{w}.initial_pool_ratio"
            ratio = _tuple_of(where, self.initial_pool_ratio, (int, float))
            for i, r in enumerate(ratio):
                if isinstance(r, bool) or math.isnan(r) or r <= 0:
                    raise ValueError(f"{where}: initial_pool_ratio values must be positive (got {r!r} at index {i})")
            # An empty ratio is the backends' length error (the reference checks the length first).
            if ratio and abs(sum(ratio) - 1.0) > 1e-6:
                raise ValueError(f"{where}: initial_pool_ratio values must sum to 1.0 (got {sum(ratio)!r})")
            _set(self, "initial_pool_ratio", tuple(float(r) for r in ratio))
        self._check_rebalance()

    @property
    def local_tiers(self) -> tuple[GpuCacheTierConfig | HostCacheTierConfig | DiskCacheTierConfig, ...]:
        """The tiers of this process's cache levels (all but a remote one), level by level."""
        return tuple(t for t in self.cache_tiers if not isinstance(t, RemoteCacheTierConfig))

    @property
    def remote_tier(self) -> RemoteCacheTierConfig | None:
        tier = self.cache_tiers[-1]
        return tier if isinstance(tier, RemoteCacheTierConfig) else None

    def _check_rebalance(self) -> None:
        w = "KVCacheManagerConfig"
        # Counts are below 2**63: the native backend keeps them in 64-bit integers.
        for name, low in (("rebalance_min_sampled_kv_caches", 0), ("rebalance_target_ratio_update_interval", 1)):
            _set(self, name, int_in_range(f"{w}.{name}", getattr(self, name), low, QUOTA_LIMIT))
        cooldown = _real(f"{w}.rebalance_cooldown_secs", self.rebalance_cooldown_secs)
        if not cooldown >= 0:
            raise ValueError(f"{w}.rebalance_cooldown_secs: must be >= 0 (got {self.rebalance_cooldown_secs!r})")
        _set(self, "rebalance_cooldown_secs", cooldown)
        threshold = _real(f"{w}.rebalance_ratio_threshold", self.rebalance_ratio_threshold)
        if not threshold > 1:
            raise ValueError(f"{w}.rebalance_ratio_threshold: must be > 1 (got {self.rebalance_ratio_threshold!r})")
        _set(self, "rebalance_ratio_threshold", threshold)
        decay = _real(f"{w}.rebalance_moving_average_decay", self.rebalance_moving_average_decay)
        if not 0 < decay < 1:
            raise ValueError(
                f"{w}.rebalance_moving_average_decay: must be in (0, 1) (got {self.rebalance_moving_average_decay!r})"
            )
        _set(self, "rebalance_moving_average_decay", decay)


def _real(where: str, value: Any) -> float:
    """A real number as a float; NaN fails every range check after it (comparisons are False)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: expected a number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int beyond any float
        raise ValueError(f"{where}: {value} is out of range") from None
