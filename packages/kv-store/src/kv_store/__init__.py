"""Block stores behind ``kv_api.BlockStore`` for kvcore's remote tier (docs/store.md):
``RedisBlockStore`` on a Valkey/Redis server a fleet shares, ``FileBlockStore`` on a local
directory that survives restarts."""

from kv_store.file_block_store import FileBlockStore
from kv_store.redis_block_store import RedisBlockStore
from kv_store.store_stats import CALL_BUCKETS, StoreStats

__all__ = ["CALL_BUCKETS", "FileBlockStore", "RedisBlockStore", "StoreStats"]
