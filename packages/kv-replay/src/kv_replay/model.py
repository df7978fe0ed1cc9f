"""The replayed model's KV-cache layout, from the command line: ``--layers`` and friends."""

from __future__ import annotations

import re

from kv_api import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, KVCacheManagerConfig

_GROUP = re.compile(r"^(\d+)(?:x(\d+))?(?:\+(\d+))?$")


def parse_layers(spec: str) -> list[tuple[int, int | None, int | None]]:
    """``"COUNT[xWINDOW][+SINKS],..."``: e.g. ``"4"`` is four full-attention layers and
    ``"2,2x1024+4"`` adds two sliding-window layers (window 1024, 4 sink tokens)."""
    groups = []
    for part in spec.split(","):
        m = _GROUP.match(part.strip())
        if not m or int(m.group(1)) == 0 or (m.group(3) and not m.group(2)):
            raise ValueError(f"--layers: bad group {part!r} (expected COUNT[xWINDOW][+SINKS], e.g. 4 or 2x1024+4)")
        groups.append(
            (int(m.group(1)), int(m.group(2)) if m.group(2) else None, int(m.group(3)) if m.group(3) else None)
        )
    return groups


def model_config(
    layers: str, tokens_per_block: int, quota: int, bytes_per_token: int, partial_reuse: bool = True
) -> KVCacheManagerConfig:
    """Key and value buffers of ``bytes_per_token * tokens_per_block`` bytes per layer."""
    size = bytes_per_token * tokens_per_block
    kv = [BufferConfig("key", size), BufferConfig("value", size)]
    configs: list[AttentionLayerConfig] = []
    for count, window, sinks in parse_layers(layers):
        for _ in range(count):
            configs.append(AttentionLayerConfig(len(configs), kv, window, sinks))
    return KVCacheManagerConfig(
        tokens_per_block=tokens_per_block,
        cache_tiers=[GpuCacheTierConfig(quota)],
        layers=configs,
        enable_partial_reuse=partial_reuse,
    )
