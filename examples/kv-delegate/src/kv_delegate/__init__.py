"""An example backend (docs/adding-a-backend.md): it delegates every call to a private copy of
the Python backend and declares a subset of the capabilities, no host or disk tier and no SSM
layers. The conformance suite skips what it does not declare and holds it to the rest."""

from __future__ import annotations

import platform

from kv_api import Capabilities
from kv_delegate._private_copy import private_copy
from kv_delegate.manager import manager_class

# Our own copy of every module: the Python backend's poison latch and classes stay its own, so
# this backend runs beside it (KV_BACKEND=delegate,py) without either seeing the other's state.
_py = private_copy("kv_core_py")

name = "delegate"
version = "0.1.0"
priority = 0  # never the default unless asked for by name
capabilities = Capabilities(swa_scratch=True, batched_calls=True, wire_events=True)

KVCacheManager = manager_class(_py.KVCacheManager)
KVCache = _py.KVCache
KVCacheEventManager = _py.KVCacheEventManager
PlannedDropHandle = _py.PlannedDropHandle
block_keys = _py.block_keys
block_keys_many = _py.block_keys_many
sequence_to_blockchain_keys = _py.sequence_to_blockchain_keys
reuse_scope_to_bytes = _py.reuse_scope_to_bytes
gen_multimodal_cache_key_tokens = _py.gen_multimodal_cache_key_tokens
cache_salt_to_id = _py.cache_salt_to_id
block_hash_v1 = _py.block_hash_v1
block_hash_v2_sha256 = _py.block_hash_v2_sha256
block_hash_v2_sha256_64 = _py.block_hash_v2_sha256_64
poison_reason = _py.poison_reason
take_poison = _py.take_poison
num_live_managers = _py.num_live_managers
_debug_poison = _py._debug_poison


def build_info() -> dict[str, str]:
    return {
        "delegates_to": f"kv_core_py {_py.version}",
        "implementation": f"{platform.python_implementation()} {platform.python_version()}",
        "sha256": "hashlib",
    }
