"""The delegate's manager: the Python backend's, refusing what this backend does not declare."""

from __future__ import annotations

from typing import Any

import kv_api
from kv_api import DiskCacheTierConfig, HostCacheTierConfig, RemoteCacheTierConfig, SsmLayerConfig


def refuse_undeclared(config: object) -> None:
    """``NotImplementedError`` for the tiers and layers ``capabilities`` leaves out, as the
    contract says (kv_api.KVCacheManager); anything else is the delegate's to judge."""
    if not isinstance(config, kv_api.KVCacheManagerConfig):
        return
    for tier in config.cache_tiers:
        if isinstance(tier, HostCacheTierConfig | DiskCacheTierConfig | RemoteCacheTierConfig):
            raise NotImplementedError(f"the delegate backend has no {type(tier).__name__} tier")
    if any(isinstance(layer, SsmLayerConfig) for layer in config.layers) or config.commit_min_snapshot:
        raise NotImplementedError("the delegate backend has no SSM layers")


def manager_class(base: type[Any]) -> type[Any]:
    """A subclass of ``base`` (the private copy's manager) that checks the config first."""

    class KVCacheManager(base):  # type: ignore[misc]
        __doc__ = base.__doc__

        def __init__(
            self,
            config: kv_api.KVCacheManagerConfig,
            event_manager: Any = None,
            page_copier: kv_api.PageCopier | None = None,
        ) -> None:
            refuse_undeclared(config)
            super().__init__(config, event_manager, page_copier)

    KVCacheManager.__module__ = __name__
    return KVCacheManager
