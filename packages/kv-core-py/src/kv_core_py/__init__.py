"""kvcore's pure-Python backend: the readable reference every other backend must match."""

from __future__ import annotations

import platform
import sys

from kv_api import Capabilities
from kv_core_py.block_keys import block_keys, block_keys_many, reuse_scope_to_bytes, sequence_to_blockchain_keys
from kv_core_py.event_hash import block_hash_v1, block_hash_v2_sha256, block_hash_v2_sha256_64, cache_salt_to_id
from kv_core_py.event_manager import KVCacheEventManager
from kv_core_py.kv_cache import KVCache
from kv_core_py.manager import KVCacheManager
from kv_core_py.planned_drop import PlannedDropHandle
from kv_core_py.poison import debug_poison as _debug_poison  # noqa: F401 - the debug hook, private
from kv_core_py.poison import num_live_managers
from kv_core_py.poison import reason as poison_reason
from kv_core_py.poison import take as take_poison
from kv_core_py.tokens import gen_multimodal_cache_key_tokens

name = "py"
version = "0.1.0"
priority = 10  # below the native backend: the reference is the fallback, not the default
capabilities = Capabilities(
    host_tier=True,
    disk_tier=True,
    remote_tier=True,
    ssm_layers=True,
    swa_scratch=True,
    batched_calls=True,
    wire_events=True,
)


def build_info() -> dict[str, str]:
    return {
        "implementation": f"{platform.python_implementation()} {platform.python_version()}",
        "sha256": "hashlib",
        "byteorder": sys.byteorder,
    }


__all__ = [
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
    "sequence_to_blockchain_keys",
    "take_poison",
    "version",
]
