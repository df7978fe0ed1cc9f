"""Config validation: the class and the field named, for every rule; valid configs are frozen."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from kv_api import (
    AttentionLayerConfig,
    BatchDesc,
    BufferConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheDesc,
    KVCacheManagerConfig,
    MemoryBlockStore,
    RemoteCacheTierConfig,
    SsmLayerConfig,
)
from kv_api._check import timeout_ms
from kv_api.constants import BUFFER_SIZE_LIMIT, LAYER_ID_LIMIT, TOKEN_LIMIT, TOKENS_PER_BLOCK_LIMIT

KV = [BufferConfig("key", 512), BufferConfig("value", 512)]
GPU = [GpuCacheTierConfig(1 << 20)]
LAYERS = [AttentionLayerConfig(0, KV)]


def manager_config(**overrides: Any) -> KVCacheManagerConfig:
    args: dict[str, Any] = {"tokens_per_block": 32, "cache_tiers": GPU, "layers": LAYERS}
    args.update(overrides)
    return KVCacheManagerConfig(**args)


BAD: list[tuple[str, Any, type[Exception], str]] = [
    ("gpu quota 0", lambda: GpuCacheTierConfig(0), ValueError, "GpuCacheTierConfig.quota"),
    ("gpu quota str", lambda: GpuCacheTierConfig("1"), TypeError, "GpuCacheTierConfig.quota"),  # type: ignore[arg-type]
    ("gpu quota bool", lambda: GpuCacheTierConfig(True), TypeError, "GpuCacheTierConfig.quota"),
    ("host quota -1", lambda: HostCacheTierConfig(-1), ValueError, "HostCacheTierConfig.quota"),
    ("gpu quota 2**63", lambda: GpuCacheTierConfig(2**63), ValueError, "GpuCacheTierConfig.quota"),
    ("host quota 2**64", lambda: HostCacheTierConfig(2**64), ValueError, "HostCacheTierConfig.quota"),
    ("disk quota 2**63", lambda: DiskCacheTierConfig(2**63, "/"), ValueError, "DiskCacheTierConfig.quota"),
    ("disk path missing", lambda: DiskCacheTierConfig(1, "/no/such/dir"), ValueError, "DiskCacheTierConfig.path"),
    ("buffer size 0", lambda: BufferConfig("key", 0), ValueError, "BufferConfig.size"),
    ("buffer role int", lambda: BufferConfig(1, 8), TypeError, "BufferConfig.role"),  # type: ignore[arg-type]
    ("buffer role empty", lambda: BufferConfig("", 8), ValueError, "BufferConfig.role"),
    ("override 0", lambda: BufferConfig("key", 8, 0), ValueError, "BufferConfig.tokens_per_block_override"),
    ("layer id -1", lambda: AttentionLayerConfig(-1, KV), ValueError, "AttentionLayerConfig.layer_id"),
    ("no buffers", lambda: AttentionLayerConfig(0, []), ValueError, "AttentionLayerConfig.buffers"),
    ("duplicate roles", lambda: AttentionLayerConfig(0, [KV[0], KV[0]]), ValueError, "AttentionLayerConfig.buffers"),
    ("buffers not configs", lambda: AttentionLayerConfig(0, [1]), TypeError, "AttentionLayerConfig.buffers[0]"),  # type: ignore[list-item]
    ("window 0", lambda: AttentionLayerConfig(0, KV, 0), ValueError, "AttentionLayerConfig.sliding_window_size"),
    (
        "sinks need a window",
        lambda: AttentionLayerConfig(0, KV, None, 4),
        ValueError,
        "AttentionLayerConfig.num_sink_tokens",
    ),
    ("ssm override", lambda: SsmLayerConfig(0, [BufferConfig("s", 8, 1)]), ValueError, "SsmLayerConfig.buffers"),
    ("desc history > capacity", lambda: KVCacheDesc(4, 5), ValueError, "KVCacheDesc.history_length"),
    ("batch system prompt -1", lambda: BatchDesc([], -1), ValueError, "BatchDesc.system_prompt_length"),
    ("tpb 0", lambda: manager_config(tokens_per_block=0), ValueError, "KVCacheManagerConfig.tokens_per_block"),
    ("tpb float", lambda: manager_config(tokens_per_block=32.0), TypeError, "KVCacheManagerConfig.tokens_per_block"),
    ("no tiers", lambda: manager_config(cache_tiers=[]), ValueError, "KVCacheManagerConfig.cache_tiers"),
    (
        "host first",
        lambda: manager_config(cache_tiers=[HostCacheTierConfig(1)]),
        ValueError,
        "KVCacheManagerConfig.cache_tiers",
    ),
    (
        "tiers out of order",
        lambda: manager_config(cache_tiers=[GPU[0], GPU[0]]),
        ValueError,
        "KVCacheManagerConfig.cache_tiers",
    ),
    ("no layers", lambda: manager_config(layers=[]), ValueError, "KVCacheManagerConfig.layers"),
    ("duplicate layer ids", lambda: manager_config(layers=LAYERS * 2), ValueError, "KVCacheManagerConfig.layers"),
    (
        "override does not divide",
        lambda: manager_config(layers=[AttentionLayerConfig(0, [BufferConfig("k", 8, 5)])]),
        ValueError,
        "KVCacheManagerConfig.layers[0]",
    ),
    (
        "ssm without snapshots",
        lambda: manager_config(layers=[SsmLayerConfig(0, [BufferConfig("s", 8)])]),
        ValueError,
        "KVCacheManagerConfig.layers[0]",
    ),
    (
        "max util 0",
        lambda: manager_config(max_util_for_resume=0.0),
        ValueError,
        "KVCacheManagerConfig.max_util_for_resume",
    ),
    (
        "max util nan",
        lambda: manager_config(max_util_for_resume=math.nan),
        ValueError,
        "KVCacheManagerConfig.max_util_for_resume",
    ),
    (
        "max util 1.5",
        lambda: manager_config(max_util_for_resume=1.5),
        ValueError,
        "KVCacheManagerConfig.max_util_for_resume",
    ),
    (
        "backoff -1",
        lambda: manager_config(reuse_match_backoff=-1),
        ValueError,
        "KVCacheManagerConfig.reuse_match_backoff",
    ),
    (
        "flag not bool",
        lambda: manager_config(enable_partial_reuse=1),
        TypeError,
        "KVCacheManagerConfig.enable_partial_reuse",
    ),
    (
        "ratio negative",
        lambda: manager_config(initial_pool_ratio=[-1.0, 2.0]),
        ValueError,
        "KVCacheManagerConfig.initial_pool_ratio",
    ),
    (
        "ratio sum",
        lambda: manager_config(initial_pool_ratio=[0.5, 0.4]),
        ValueError,
        "KVCacheManagerConfig.initial_pool_ratio",
    ),
    (
        "constraints not batches",
        lambda: manager_config(constraints=[1]),
        TypeError,
        "KVCacheManagerConfig.constraints[0]",
    ),
]


@pytest.mark.parametrize(("make", "error", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_invalid_config_names_field(make: Any, error: type[Exception], field: str) -> None:
    with pytest.raises(error) as info:
        make()
    assert type(info.value) is error
    assert str(info.value).startswith(field + ":"), str(info.value)


def test_valid_config_is_frozen_and_normalised(tmp_path: Any) -> None:
    config = manager_config(
        cache_tiers=[GPU[0], HostCacheTierConfig(1 << 20), DiskCacheTierConfig(1 << 20, tmp_path)],
        initial_pool_ratio=[1],
    )
    assert isinstance(config.layers, tuple) and isinstance(config.cache_tiers, tuple)
    assert config.initial_pool_ratio == (1.0,)
    assert config.cache_tiers[2].path == str(tmp_path)
    with pytest.raises(AttributeError):
        config.tokens_per_block = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: manager_config(initial_pool_ratio=[-1.0, 2.0]),
            "KVCacheManagerConfig.initial_pool_ratio: initial_pool_ratio values must be positive (got -1.0 at index 0)",
        ),
        (
            lambda: manager_config(initial_pool_ratio=[0.5, 0.0, 0.5]),
            "KVCacheManagerConfig.initial_pool_ratio: initial_pool_ratio values must be positive (got 0.0 at index 1)",
        ),
        (
            lambda: manager_config(initial_pool_ratio=[0.5, 0.4]),
            "KVCacheManagerConfig.initial_pool_ratio: initial_pool_ratio values must sum to 1.0 (got 0.9)",
        ),
        (
            lambda: manager_config(max_util_for_resume=1.5),
            "KVCacheManagerConfig.max_util_for_resume: max_util_for_resume must be in (0, 1] (got 1.5)",
        ),
    ],
    ids=["ratio negative", "ratio zero", "ratio sum", "max util"],
)
def test_messages_carry_the_reference_phrases(make: Any, message: str) -> None:
    """Code written against the reference matches on its phrases; the field is still named first."""
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == message


@pytest.mark.parametrize("window", [None, 8])
def test_zero_sinks_need_no_window(window: int | None) -> None:
    """Zero sink tokens are no sinks: valid with or without a window; only a positive count needs one."""
    layer = AttentionLayerConfig(0, KV, window, 0)
    assert (layer.sliding_window_size, layer.num_sink_tokens) == (window, 0)
    assert AttentionLayerConfig(0, KV, 8, 4).num_sink_tokens == 4
    with pytest.raises(ValueError, match="a positive count requires sliding_window_size"):
        AttentionLayerConfig(0, KV, None, 1)


def test_replace_builds_a_validated_copy() -> None:
    """Configs stay frozen: ``dataclasses.replace`` is how a changed one is made, validated again."""
    config = manager_config()
    changed = dataclasses.replace(config, max_util_for_resume=0.5, initial_pool_ratio=[1])
    assert (changed.max_util_for_resume, changed.initial_pool_ratio) == (0.5, (1.0,))
    assert config.max_util_for_resume == 0.97
    with pytest.raises(ValueError, match="max_util_for_resume must be in"):
        dataclasses.replace(config, max_util_for_resume=0.0)


# Each numeric field at its documented bound (docs/errors.md, "Ranges"): the last valid value
# builds, the first invalid one is a ValueError naming the field and the range.
LIMITS: list[tuple[str, Any, int, int]] = [
    ("tokens_per_block", lambda v: manager_config(tokens_per_block=v), 1, TOKENS_PER_BLOCK_LIMIT),
    ("tokens_per_block_override", lambda v: BufferConfig("k", 8, v), 1, TOKENS_PER_BLOCK_LIMIT),
    ("size", lambda v: BufferConfig("k", v), 1, BUFFER_SIZE_LIMIT),
    ("layer_id", lambda v: AttentionLayerConfig(v, KV), 0, LAYER_ID_LIMIT),
    ("layer_id", lambda v: SsmLayerConfig(v, KV), 0, LAYER_ID_LIMIT),
    ("sliding_window_size", lambda v: AttentionLayerConfig(0, KV, v), 1, TOKEN_LIMIT),
    ("num_sink_tokens", lambda v: AttentionLayerConfig(0, KV, 8, v), 0, TOKEN_LIMIT),
    ("capacity", lambda v: KVCacheDesc(v, 0), 0, TOKEN_LIMIT),
    ("system_prompt_length", lambda v: BatchDesc([], v), 0, TOKEN_LIMIT),
    ("reuse_match_backoff", lambda v: manager_config(reuse_match_backoff=v), 0, TOKEN_LIMIT),
    ("quota", GpuCacheTierConfig, 1, 1 << 63),
]


@pytest.mark.parametrize(("field", "make", "low", "high"), LIMITS, ids=[f"{x[0]}-{i}" for i, x in enumerate(LIMITS)])
def test_numeric_fields_at_their_bounds(field: str, make: Any, low: int, high: int) -> None:
    make(low)
    make(high - 1)
    for bad in (low - 1, high, 2**64, 2**100):
        with pytest.raises(ValueError, match=rf"\.{field}: must be in \[{low}, {high}\) \(got {bad}\)$"):
            make(bad)
    with pytest.raises(TypeError, match=rf"\.{field}: expected an int, got bool$"):
        make(True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), (math.inf, None), (2**2000, None), (0, 0.0), (-3, 0.0), (-(2**2000), 0.0), (1.5, 1.5), (7, 7.0)],
)
def test_timeout_accepts_numbers_and_none(value: Any, expected: float | None) -> None:
    assert timeout_ms("timeout_ms", value) == expected


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("5", TypeError, "timeout_ms: expected a number or None, got str"),
        (True, TypeError, "timeout_ms: expected a number or None, got bool"),
        (math.nan, ValueError, "timeout_ms: must not be NaN"),
    ],
)
def test_timeout_refuses(value: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        timeout_ms("timeout_ms", value)


def _remote_config(*tiers: Any) -> KVCacheManagerConfig:
    return KVCacheManagerConfig(4, list(tiers), [AttentionLayerConfig(0, [BufferConfig("k", 64)])])


def test_a_remote_tier_comes_last_and_is_not_a_level() -> None:
    remote = RemoteCacheTierConfig(MemoryBlockStore(), "model", "rev")
    config = _remote_config(GpuCacheTierConfig(1 << 20), HostCacheTierConfig(1 << 20), remote)
    assert config.remote_tier is remote and len(config.local_tiers) == 2
    assert _remote_config(GpuCacheTierConfig(1 << 20)).remote_tier is None
    with pytest.raises(ValueError, match="ordered GPU, host, disk, remote"):
        _remote_config(GpuCacheTierConfig(1 << 20), remote, HostCacheTierConfig(1 << 20))
    with pytest.raises(ValueError, match="first tier must be a GpuCacheTierConfig"):
        _remote_config(remote)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"store": object(), "model_id": "m"}, TypeError, "RemoteCacheTierConfig.store: expected a kv_api.BlockStore"),
        ({"model_id": ""}, ValueError, "RemoteCacheTierConfig.model_id: must be non-empty"),
        ({"model_id": "a:b"}, ValueError, "RemoteCacheTierConfig.model_id: must be printable without ':'"),
        ({"model_id": "m", "revision": "\n"}, ValueError, "RemoteCacheTierConfig.revision: must be printable"),
        ({"model_id": 3}, TypeError, "RemoteCacheTierConfig.model_id"),
    ],
)
def test_a_remote_tier_config_names_the_field(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(")):
        RemoteCacheTierConfig(**{"store": MemoryBlockStore(), **kwargs})
