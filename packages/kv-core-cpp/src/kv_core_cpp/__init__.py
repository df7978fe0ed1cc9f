"""kvcore's native backend: a C++17 core bound with nanobind, identical in behaviour to ``py``."""

from __future__ import annotations

import kv_api
from kv_api import Capabilities
from kv_core_cpp._core import (
    BAD_PAGE_INDEX,
    DEFAULT_KEY_FORMAT,
    DEFAULT_PRIORITY,
    GPU_LEVEL,
    KEY_FORMATS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    KVCache,
    KVCacheEventManager,
    KVCacheManager,
    PlannedDropHandle,
    block_hash_v1,
    block_hash_v2_sha256,
    block_hash_v2_sha256_64,
    block_keys,
    block_keys_many,
    cache_salt_to_id,
    gen_multimodal_cache_key_tokens,
    num_live_managers,
    poison_reason,
    reuse_scope_to_bytes,
    select_sha256_transform,
    sequence_to_blockchain_keys,
    sha256,
    sha256_transform,
    sha256_transforms,
    take_poison,
)
from kv_core_cpp._core import build_info as _build_info
from kv_core_cpp._core import debug_poison as _debug_poison  # noqa: F401 - the debug hook, private

name = "cpp"
version = "0.1.0"
priority = 20  # the default wherever it loads
capabilities = Capabilities(
    native_buffers=True,
    host_tier=True,
    disk_tier=True,
    remote_tier=True,
    ssm_layers=True,
    swa_scratch=True,
    batched_calls=True,
    wire_events=True,
    sha256_transforms=tuple(sha256_transforms()),
)

# nanobind classes cannot subclass the ABCs; registering makes isinstance() hold.
kv_api.KVCacheManager.register(KVCacheManager)
kv_api.KVCache.register(KVCache)
kv_api.KVCacheEventManager.register(KVCacheEventManager)
kv_api.PlannedDropHandle.register(PlannedDropHandle)


def build_info() -> dict[str, str]:
    return dict(_build_info())


__all__ = [
    "BAD_PAGE_INDEX",
    "DEFAULT_KEY_FORMAT",
    "DEFAULT_PRIORITY",
    "GPU_LEVEL",
    "KEY_FORMATS",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "KVCache",
    "KVCacheEventManager",
    "KVCacheManager",
    "PlannedDropHandle",
    "block_hash_v1",
    "block_hash_v2_sha256",
    "block_hash_v2_sha256_64",
    "block_keys",
    "block_keys_many",
    "build_info",
    "cache_salt_to_id",
    "capabilities",
    "gen_multimodal_cache_key_tokens",
    "name",
    "num_live_managers",
    "poison_reason",
    "priority",
    "reuse_scope_to_bytes",
    "select_sha256_transform",
    "sequence_to_blockchain_keys",
    "sha256",
    "sha256_transform",
    "sha256_transforms",
    "take_poison",
    "version",
]
