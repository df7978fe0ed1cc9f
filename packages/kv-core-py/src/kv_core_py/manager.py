"""The Python backend's KV-cache manager."""

from __future__ import annotations

from typing import Any

import kv_api
from kv_api.config import KVCacheManagerConfig


class KVCacheManager(kv_api.KVCacheManager):
    """See ``kv_api.KVCacheManager`` for the contract."""

    def __init__(self, config: KVCacheManagerConfig, event_manager: Any = None) -> None:
        if not isinstance(config, KVCacheManagerConfig):
            raise TypeError(f"config: expected KVCacheManagerConfig, got {type(config).__name__}")
        self._config = config  # frozen, so sharing it is a copy in all but identity

    @property
    def init_config(self) -> KVCacheManagerConfig:
        return self._config

    @property
    def tokens_per_block(self) -> int:
        return self._config.tokens_per_block
