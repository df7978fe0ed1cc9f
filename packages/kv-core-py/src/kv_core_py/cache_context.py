"""What a KV cache works through: the part of its manager's state a cache reads and changes
(docs/manager.md, "A cache and its manager")."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import fields

from kv_api.config import KVCacheManagerConfig
from kv_api.contract import KVCache
from kv_api.stats import CacheStats
from kv_core_py.event_manager import KVCacheEventManager
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.radix_tree import Block, RadixTree
from kv_core_py.rebalancer import Rebalancer
from kv_core_py.remote_tier import RemoteTier
from kv_core_py.scratch import scratch_rules
from kv_core_py.storage import Storage
from kv_core_py.tokens import Tokens

_COUNTERS = [f.name for f in fields(CacheStats)]


class CacheContext:
    """Built by the manager, which owns it and everything it refers to, and handed to each cache
    it creates. The manager works through it too for the state they share: the lock, the open
    caches, the shut-down flag and the statistics."""

    def __init__(
        self,
        config: KVCacheManagerConfig,
        registry: LifeCycleRegistry,
        storage: Storage,
        tree: RadixTree,
        events: KVCacheEventManager | None,
    ) -> None:
        self.lock = threading.RLock()  # held by every public call of the manager and its caches
        # The config values a cache reads.
        self.tokens_per_block = config.tokens_per_block
        self.key_format = config.key_format
        self.max_util_for_resume = config.max_util_for_resume
        self.commit_min_snapshot = config.commit_min_snapshot
        # Sliding-window scratch: configured or not, and per layer group its rule (None: never).
        self.swa_scratch_reuse = config.swa_scratch_reuse
        self.scratch = scratch_rules(config, registry, storage.config)
        self.registry = registry
        self.storage = storage
        self.tree = tree
        self.events = events  # None: no event manager
        # The manager's reuse match without reuse_match_backoff (set by the manager): a planned
        # drop re-matches the committed tokens (planned_drop.py).
        self.rematch: Callable[[bytes, Tokens], list[tuple[Block, int]]] = lambda root_key, tokens: []
        self.remote: RemoteTier | None = None  # the remote tier, set by the manager where configured
        self.is_shut_down = False  # set by the manager's shutdown()
        self.rebalancer = Rebalancer(config, registry, storage.config)  # closing caches feed it
        # Plain counters, added to on the hot path (a decode step); CacheStats is built when read.
        self._committed = dict.fromkeys(_COUNTERS, 0)
        self._iteration = dict.fromkeys(_COUNTERS, 0)
        # Weak: a cache nobody references is closed by its finaliser, as the native one is.
        self._open_caches: weakref.WeakValueDictionary[int, KVCache] = weakref.WeakValueDictionary()

    def add_stats(self, **counts: int) -> None:
        """Add to the committed and the iteration statistics."""
        for name, value in counts.items():
            self._committed[name] += value
            self._iteration[name] += value

    @property
    def committed_stats(self) -> CacheStats:
        return CacheStats(**self._committed)

    @property
    def iteration_stats(self) -> CacheStats:
        return CacheStats(**self._iteration)

    def reset_iteration_stats(self) -> None:
        self._iteration = dict.fromkeys(_COUNTERS, 0)

    def register_cache(self, cache: KVCache) -> None:
        """A cache is open from its creation until it unregisters itself on close."""
        self._open_caches[id(cache)] = cache

    def unregister_cache(self, cache: KVCache) -> None:
        self._open_caches.pop(id(cache), None)

    def open_caches(self) -> list[KVCache]:
        return list(self._open_caches.values())

    @property
    def num_open_caches(self) -> int:
        return len(self._open_caches)
