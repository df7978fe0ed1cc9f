"""The replayed model's KV-cache layout, from the command line: ``--layers`` and friends."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kv_api import (
    AttentionLayerConfig,
    BlockStore,
    BufferConfig,
    CacheTierConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
    RemoteCacheTierConfig,
    SsmLayerConfig,
)
from kv_api.constants import ceil_div
from kv_replay.options import OptionError

_GROUP = re.compile(r"^(\d{1,9})(?:x(\d{1,12}))?(?:\+(\d{1,12}))?$")
_SSM_GROUP = re.compile(r"^(\d{1,9})ssm$")
#: A group's window that stands for SSM layers in what ``parse_layers`` returns.
SSM = -1
MAX_LAYERS = 1024
#: The model id of the replay's store keys: every replay of one layout shares a store's blocks.
REMOTE_MODEL_ID = "kvcore-replay"
#: ``(count, window, sinks)``: a group of ``count`` layers alike (window ``SSM``: state-space).
Group = tuple[int, int | None, int | None]


class ModelError(OptionError):
    """A model or tier option the manager cannot take; ``field`` names the option."""


@dataclass(frozen=True)
class Layers:
    """A ``--layers`` spec, parsed (and so checked) once: as written, without spaces, and its groups."""

    spec: str
    groups: tuple[Group, ...]

    @classmethod
    def parse(cls, spec: str) -> Layers:
        return cls(spec.replace(" ", ""), tuple(parse_layers(spec)))

    @property
    def count(self) -> int:
        return sum(count for count, _, _ in self.groups)


#: Evicted block keys a replay's manager remembers: far more than the engine default (65,536), so
#: that a block evicted early in a long trace still counts as evicted, not never seen, when it is
#: asked for again (memory grows with the blocks actually evicted, 64 to 100 bytes each native).
GHOST_RECORD_BLOCKS = 1 << 22


def parse_layers(spec: str) -> list[Group]:
    """``"COUNT[xWINDOW][+SINKS],..."`` or ``"COUNTssm"``: e.g. ``"4"`` is four full-attention
    layers, ``"2,2x1024+4"`` adds two sliding-window layers (window 1024, 4 sink tokens) and
    ``"2,6ssm"`` six state-space layers (their window is ``SSM``)."""
    groups: list[Group] = []
    for part in spec.split(","):
        ssm = _SSM_GROUP.match(part.strip())
        if ssm:
            if int(ssm.group(1)) == 0:
                raise ModelError("layers", f"{part.strip()!r}: the layer count must be at least 1")
            groups.append((int(ssm.group(1)), SSM, None))
            continue
        m = _GROUP.match(part.strip())
        if not m or (m.group(3) and not m.group(2)):
            raise ModelError(
                "layers", f"bad group {part!r} (expected COUNT[xWINDOW][+SINKS] or COUNTssm, e.g. 4, 2x1024+4 or 2ssm)"
            )
        count, window, sinks = (int(g) if g else None for g in m.groups())
        assert count is not None
        if count == 0 or window == 0:
            raise ModelError("layers", f"{part.strip()!r}: the layer count and the window must be at least 1")
        groups.append((count, window, sinks))
    if sum(count for count, _, _ in groups) > MAX_LAYERS:
        raise ModelError("layers", f"at most {MAX_LAYERS} layers (got {sum(c for c, _, _ in groups)})")
    return groups


def model_config(
    layers: str | Layers,
    tokens_per_block: int,
    quota: int,
    bytes_per_token: int,
    partial_reuse: bool = True,
    pool_ratio: list[float] | None = None,
    *,
    host_quota: int | None = None,
    disk_quota: int | None = None,
    disk_path: str | None = None,
    remote: BlockStore | None = None,
) -> KVCacheManagerConfig:
    """Key and value buffers of ``bytes_per_token * tokens_per_block`` bytes per attention layer,
    and a state of twice that per SSM layer (whose presence turns on ``commit_min_snapshot``);
    ``pool_ratio`` splits the quota between layer groups (default: the manager's split). A
    ``host_quota`` adds a host tier, a ``disk_quota`` a disk tier in ``disk_path``, a ``remote``
    store the remote tier (model id ``kvcore-replay``). The pools' memory is not populated
    (``populate_memory=False``): nothing writes the pages, so a quota beyond RAM replays.

    Built field by field, each under the option it comes from: a value kv_api refuses is a
    ``ModelError`` naming that option."""
    groups = (layers if isinstance(layers, Layers) else Layers.parse(layers)).groups
    size = bytes_per_token * tokens_per_block
    with _option("bytes_per_token"):
        kv = [BufferConfig("key", size), BufferConfig("value", size)]
        state = [BufferConfig("state", 2 * size)] if any(window == SSM for _, window, _ in groups) else []
    with _option("layers"):
        configs = _layer_configs(groups, kv, state)
    with _option("quota"):
        tiers: list[CacheTierConfig] = [GpuCacheTierConfig(quota)]
    if host_quota is not None:
        with _option("host_quota"):
            tiers.append(HostCacheTierConfig(host_quota))
    if disk_quota is not None:
        # --disk-quota's type checked the quota against the same range: what fails is the directory.
        with _option("disk_path"):
            tiers.append(DiskCacheTierConfig(disk_quota, disk_path or ""))
    if remote is not None:
        tiers.append(RemoteCacheTierConfig(remote, REMOTE_MODEL_ID))
    with _option("tokens_per_block"):  # the one field not built above
        config = KVCacheManagerConfig(
            tokens_per_block=tokens_per_block,
            cache_tiers=tiers,
            layers=configs,
            enable_partial_reuse=partial_reuse,
            commit_min_snapshot=any(isinstance(layer, SsmLayerConfig) for layer in configs),
            ghost_record_blocks=GHOST_RECORD_BLOCKS,
            populate_memory=False,  # a replay writes no page: its quota costs address space, not RAM
        )
    if pool_ratio is None:
        return config
    with _option(None):  # computed by the caller, not an option
        return dataclasses.replace(config, initial_pool_ratio=pool_ratio)


def _layer_configs(
    groups: tuple[Group, ...], kv: list[BufferConfig], state: list[BufferConfig]
) -> list[AttentionLayerConfig | SsmLayerConfig]:
    configs: list[AttentionLayerConfig | SsmLayerConfig] = []
    for count, window, sinks in groups:
        for _ in range(count):
            if window == SSM:
                configs.append(SsmLayerConfig(len(configs), state))
            else:
                configs.append(AttentionLayerConfig(len(configs), kv, window, sinks))
    return configs


@contextmanager
def _option(field: str | None) -> Iterator[None]:
    """kv_api's refusal of what was built from the option ``field`` (None: from no option) as a
    ``ModelError`` naming it. kv_api's message starts with its own field's name, the one part
    that the option's flag replaces."""
    try:
        yield
    except (ValueError, TypeError, OverflowError) as exc:
        message = str(exc)
        raise ModelError(field, message if field is None else message.partition(": ")[2] or message) from None


def unbounded_quota(tokens: int, requests: int, config: KVCacheManagerConfig) -> int:
    """A device quota that holds every block of ``requests`` requests totalling ``tokens``
    tokens, for each pool group given an equal share of it times the number of groups. Pools
    commit only the memory they touch, so this costs address space, not RAM."""
    blocks = ceil_div(tokens, config.tokens_per_block) + requests  # a partial tail each
    return blocks * block_bytes(config)


def block_bytes(config: KVCacheManagerConfig) -> int:
    """Bytes of one block of every layer's buffers: a device slot, with one pool group."""
    return sum(b.size for layer in config.layers for b in layer.buffers)
