"""The replayed model's KV-cache layout, from the command line: ``--layers`` and friends."""

from __future__ import annotations

import re

from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    CacheTierConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
    SsmLayerConfig,
)
from kv_api.constants import ceil_div

_GROUP = re.compile(r"^(\d{1,9})(?:x(\d{1,12}))?(?:\+(\d{1,12}))?$")
_SSM_GROUP = re.compile(r"^(\d{1,9})ssm$")
#: A group's window that stands for SSM layers in what ``parse_layers`` returns.
SSM = -1
MAX_LAYERS = 1024
#: The config's fields that each flag sets, to name the flag if the library rejects a value.
_FLAGS = {
    "GpuCacheTierConfig.quota": "--quota",
    "HostCacheTierConfig.quota": "--host-quota",
    "DiskCacheTierConfig.quota": "--disk-quota",
    "DiskCacheTierConfig.path": "--disk-path",
    "KVCacheManagerConfig.tokens_per_block": "--tokens-per-block",
    "BufferConfig.size": "--bytes-per-token",
    "AttentionLayerConfig.": "--layers",
    "KVCacheManagerConfig.layers": "--layers",
}


class ModelError(ValueError):
    """A model flag the manager cannot take; the message names the flag."""


def parse_layers(spec: str) -> list[tuple[int, int | None, int | None]]:
    """``"COUNT[xWINDOW][+SINKS],..."`` or ``"COUNTssm"``: e.g. ``"4"`` is four full-attention
    layers, ``"2,2x1024+4"`` adds two sliding-window layers (window 1024, 4 sink tokens) and
    ``"2,6ssm"`` six state-space layers (their window is ``SSM``)."""
    groups: list[tuple[int, int | None, int | None]] = []
    for part in spec.split(","):
        ssm = _SSM_GROUP.match(part.strip())
        if ssm:
            if int(ssm.group(1)) == 0:
                raise ModelError(f"--layers: {part.strip()!r}: the layer count must be at least 1")
            groups.append((int(ssm.group(1)), SSM, None))
            continue
        m = _GROUP.match(part.strip())
        if not m or (m.group(3) and not m.group(2)):
            raise ModelError(
                f"--layers: bad group {part!r} (expected COUNT[xWINDOW][+SINKS] or COUNTssm, e.g. 4, 2x1024+4 or 2ssm)"
            )
        count, window, sinks = (int(g) if g else None for g in m.groups())
        assert count is not None
        if count == 0 or window == 0:
            raise ModelError(f"--layers: {part.strip()!r}: the layer count and the window must be at least 1")
        groups.append((count, window, sinks))
    if sum(count for count, _, _ in groups) > MAX_LAYERS:
        raise ModelError(f"--layers: at most {MAX_LAYERS} layers (got {sum(c for c, _, _ in groups)})")
    return groups


def model_config(
    layers: str,
    tokens_per_block: int,
    quota: int,
    bytes_per_token: int,
    partial_reuse: bool = True,
    pool_ratio: list[float] | None = None,
    *,
    host_quota: int | None = None,
    disk_quota: int | None = None,
    disk_path: str | None = None,
) -> KVCacheManagerConfig:
    """Key and value buffers of ``bytes_per_token * tokens_per_block`` bytes per attention layer,
    and a state of twice that per SSM layer (whose presence turns on ``commit_min_snapshot``);
    ``pool_ratio`` splits the quota between layer groups (default: the manager's split). A
    ``host_quota`` adds a host tier, a ``disk_quota`` a disk tier in ``disk_path``."""
    size = bytes_per_token * tokens_per_block
    try:
        kv = [BufferConfig("key", size), BufferConfig("value", size)]
        configs: list[AttentionLayerConfig | SsmLayerConfig] = []
        for count, window, sinks in parse_layers(layers):
            for _ in range(count):
                if window == SSM:
                    configs.append(SsmLayerConfig(len(configs), [BufferConfig("state", 2 * size)]))
                else:
                    configs.append(AttentionLayerConfig(len(configs), kv, window, sinks))
        tiers: list[CacheTierConfig] = [GpuCacheTierConfig(quota)]
        if host_quota is not None:
            tiers.append(HostCacheTierConfig(host_quota))
        if disk_quota is not None:
            tiers.append(DiskCacheTierConfig(disk_quota, disk_path or ""))
        return KVCacheManagerConfig(
            tokens_per_block=tokens_per_block,
            cache_tiers=tiers,
            layers=configs,
            enable_partial_reuse=partial_reuse,
            initial_pool_ratio=pool_ratio,
            commit_min_snapshot=any(isinstance(layer, SsmLayerConfig) for layer in configs),
        )
    except (ValueError, TypeError, OverflowError) as exc:
        if isinstance(exc, ModelError):
            raise
        message = str(exc)
        field, _, why = message.partition(": ")
        flag = next((f for prefix, f in _FLAGS.items() if field.startswith(prefix)), None)
        raise ModelError(f"{flag}: {why}" if flag else message) from None


def unbounded_quota(tokens: int, requests: int, config: KVCacheManagerConfig) -> int:
    """A device quota that holds every block of ``requests`` requests totalling ``tokens``
    tokens, for each pool group given an equal share of it times the number of groups. Pools
    commit only the memory they touch, so this costs address space, not RAM."""
    blocks = ceil_div(tokens, config.tokens_per_block) + requests  # a partial tail each
    return blocks * sum(b.size for layer in config.layers for b in layer.buffers)
