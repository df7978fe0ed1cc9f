"""kvcore's shared contract: data types, errors, key spec and the backend registry.

``kv_api.create_manager(config)`` builds a manager on the default backend (``KV_BACKEND``, else
the highest priority); ``kv_api.load_backend(name)`` gives any installed backend explicitly.
"""

from kv_api import block_value, descriptors, errors, events, keys, stats
from kv_api.block_store import BlockStore, MemoryBlockStore
from kv_api.capabilities import Capabilities
from kv_api.config import (
    AttentionLayerConfig,
    BatchDesc,
    BufferConfig,
    CacheTierConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheDesc,
    KVCacheManagerConfig,
    LayerConfig,
    RemoteCacheTierConfig,
    SsmLayerConfig,
    SwaScratchReuseConfig,
)
from kv_api.constants import (
    BAD_PAGE_INDEX,
    DEFAULT_PRIORITY,
    GPU_LEVEL,
    KEY_FORMATS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    CacheTier,
    KVCacheStatus,
    PageIndexMode,
    PageStatus,
)
from kv_api.contract import (
    Backend,
    KVCache,
    KVCacheEventManager,
    KVCacheManager,
    PlannedDropHandle,
    PriorityCallback,
    TokenInput,
)
from kv_api.descriptors import (
    BufferId,
    BufferLocation,
    LifeCycle,
    PageIndexConverter,
    PoolDesc,
    PoolGroupDesc,
    ScratchDesc,
)
from kv_api.page_copier import CopyRun, HostMemoryCopier, PageCopier
from kv_api.registry import (
    ENTRY_POINT_GROUP,
    available_backends,
    create_manager,
    default_backend_name,
    installed_backends,
    load_backend,
)
from kv_api.scope import DIGEST_SIZE, MmItemContext, ReuseScope
from kv_api.stats import (
    CacheStats,
    DecodeSteps,
    KVCacheStatsDelta,
    LifeCycleStats,
    ReuseMatch,
    SsmSnapshotStats,
    StorageStatistics,
)
from kv_api.store_keys import StoreKeys

__version__ = "0.1.0"

__all__ = [
    "BAD_PAGE_INDEX",
    "DEFAULT_PRIORITY",
    "DIGEST_SIZE",
    "ENTRY_POINT_GROUP",
    "GPU_LEVEL",
    "KEY_FORMATS",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "AttentionLayerConfig",
    "Backend",
    "BatchDesc",
    "BlockStore",
    "BufferConfig",
    "BufferId",
    "BufferLocation",
    "CacheStats",
    "CacheTier",
    "CacheTierConfig",
    "Capabilities",
    "CopyRun",
    "DecodeSteps",
    "DiskCacheTierConfig",
    "GpuCacheTierConfig",
    "HostCacheTierConfig",
    "HostMemoryCopier",
    "KVCache",
    "KVCacheDesc",
    "KVCacheEventManager",
    "KVCacheManager",
    "KVCacheManagerConfig",
    "KVCacheStatsDelta",
    "KVCacheStatus",
    "LayerConfig",
    "LifeCycle",
    "LifeCycleStats",
    "MemoryBlockStore",
    "MmItemContext",
    "PageCopier",
    "PageIndexConverter",
    "PageIndexMode",
    "PageStatus",
    "PlannedDropHandle",
    "PoolDesc",
    "PoolGroupDesc",
    "PriorityCallback",
    "RemoteCacheTierConfig",
    "ReuseMatch",
    "ReuseScope",
    "ScratchDesc",
    "SsmLayerConfig",
    "SsmSnapshotStats",
    "StorageStatistics",
    "StoreKeys",
    "SwaScratchReuseConfig",
    "TokenInput",
    "available_backends",
    "block_value",
    "create_manager",
    "default_backend_name",
    "descriptors",
    "errors",
    "events",
    "installed_backends",
    "keys",
    "load_backend",
    "stats",
]
