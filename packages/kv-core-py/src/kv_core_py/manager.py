"""The Python backend's KV-cache manager (docs/manager.md)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import kv_api
from kv_api._check import as_int, as_str, int_in_range
from kv_api.config import QUOTA_LIMIT, KVCacheManagerConfig
from kv_api.constants import CACHE_ID_LIMIT, GPU_LEVEL, TOKEN_LIMIT, PageIndexMode
from kv_api.descriptors import BufferLocation, LifeCycle, PageIndexConverter, PoolDesc, PoolGroupDesc
from kv_api.errors import InvalidStateError, LogicError, OutOfPagesError
from kv_api.page_copier import HostMemoryCopier, PageCopier
from kv_api.stats import CacheStats, LifeCycleStats, SsmSnapshotStats, StorageStatistics
from kv_core_py import batch, poison
from kv_core_py.cache_context import CacheContext
from kv_core_py.cache_level import CacheLevel, at_level
from kv_core_py.event_manager import KVCacheEventManager
from kv_core_py.ghost_record import GhostRecord
from kv_core_py.kv_cache import KVCache
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.manager_reuse import ManagerReuse
from kv_core_py.page import Page
from kv_core_py.page_transfer import PageTransfer
from kv_core_py.radix_tree import Block, RadixTree
from kv_core_py.remote_tier import RemoteTier
from kv_core_py.request_stats import StatsBook
from kv_core_py.scope_free_index import ScopeFreeIndex
from kv_core_py.slot_counts import SlotCounts, clamp_max_seq_len
from kv_core_py.storage import Storage
from kv_core_py.storage_config import BufferPlacement, StorageConfig


class KVCacheManager(ManagerReuse):
    """See ``kv_api.KVCacheManager`` for the contract. Every public member checks the poison latch
    first (``poison.py``); a manager counts as alive from its construction to its shutdown or
    collection."""

    def __init__(
        self,
        config: KVCacheManagerConfig,
        event_manager: KVCacheEventManager | None = None,
        page_copier: PageCopier | None = None,
    ) -> None:
        poison.check()
        if not isinstance(config, KVCacheManagerConfig):
            raise TypeError(f"config: expected KVCacheManagerConfig, got {type(config).__name__}")
        if event_manager is not None and not isinstance(event_manager, KVCacheEventManager):
            raise TypeError(
                f"event_manager: expected this backend's KVCacheEventManager, got {type(event_manager).__name__}"
            )
        if page_copier is not None and not isinstance(page_copier, PageCopier):
            raise TypeError(f"page_copier: expected a kv_api.PageCopier, got {type(page_copier).__name__}")
        self._config = config
        self._registry = LifeCycleRegistry(config)
        self._storage_config = StorageConfig(config, self._registry)
        levels: list[CacheLevel] = []
        try:
            for level in range(len(config.local_tiers)):
                levels.append(CacheLevel(config, self._registry, self._storage_config, level))
        except BaseException:
            for built in levels:
                built.close()
            raise
        self._counts = levels[0].counts
        self._tree = RadixTree(len(self._registry.life_cycles), config.tokens_per_block)
        if config.reuse_report:
            self._tree.ghost = GhostRecord(config.ghost_record_blocks)
            if config.reuse_report_other_scope:
                self._tree.scope_free = ScopeFreeIndex(config.tokens_per_block, config.key_format)
        if event_manager is not None:
            resync = weakref.WeakMethod(self._resync_events)  # weak: the events must not keep the manager

            def resync_events() -> bool:
                method = resync()
                return method is not None and method()

            event_manager.bind([life.window for life in self._registry.life_cycles], resync_events)
        # The default copier is memmove in this process: no Python call per batch.
        copier = None if page_copier is None or type(page_copier) is HostMemoryCopier else page_copier
        self._storage = Storage(
            self._storage_config, levels, self._registry, self._tree, event_manager, PageTransfer(levels, copier)
        )
        # The lock, the open caches, the shut-down flag and the statistics live there, shared with the caches.
        self._context = CacheContext(config, self._registry, self._storage, self._tree, event_manager)
        if (remote := config.remote_tier) is not None:
            self._context.remote = RemoteTier(
                remote, config, self._registry, self._storage, self._tree, event_manager, self._context.add_stats
            )
        # Weak: the context must not keep its manager alive (a cache does, and it alone re-matches).
        match = weakref.WeakMethod(self._match)
        self._context.rematch = lambda key, tokens: cast(Callable[..., list[tuple[Block, int]]], match())(
            key, tokens, False
        )
        self._stats = StatsBook(self._context)  # excluded and dirty ids, per-layer-group counters
        self._next_id = 0
        self._layout_version = 0
        if event_manager is not None:
            event_manager.created(tuple(sum(level.counts.slots) for level in levels))
        # Last, once nothing can fail: take_poison() waits until this is released.
        self._live = poison.LiveManager(self)

    def _resync_events(self) -> bool:
        """The event ring would overflow: it is replaced by the tree as it is (event_manager.py)."""
        with self._context.lock:
            events = self._context.events
            assert events is not None
            totals = tuple(sum(g.num_slots for g in level.pool_groups) for level in self._storage.levels)
            events.resync_to(totals, list(self._tree.roots.values()))
            return True

    # -- configuration ------------------------------------------------------------------------

    @property
    def init_config(self) -> KVCacheManagerConfig:
        poison.check()
        return self._config

    @property
    def tokens_per_block(self) -> int:
        poison.check()
        return self._config.tokens_per_block

    @property
    def life_cycles(self) -> list[LifeCycle]:
        poison.check()
        return list(self._registry.life_cycles)

    @property
    def layer_grouping(self) -> list[list[int]]:
        """Layer ids per layer group (``LifeCycle.id``), in config order."""
        poison.check()
        groups: list[list[int]] = [[] for _ in self._registry.life_cycles]
        for layer, group in self._registry.layer_group_of.items():
            groups[group].append(layer)
        return groups

    @property
    def layer_ids(self) -> list[int]:
        poison.check()
        return list(self._registry.layer_group_of)

    @property
    def num_layers(self) -> int:
        poison.check()
        return len(self._registry.layer_group_of)

    def get_layer_group_id(self, layer_id: int) -> int:
        poison.check()
        with self._context.lock:
            self._require_live()
            layer = as_int("layer_id", layer_id)  # looked up as __index__ gives it (numpy scalars too)
            try:
                return self._registry.layer_group_of[layer]
            except KeyError:
                raise KeyError(f"no layer {layer}") from None

    def _require_live(self) -> None:
        if self._context.is_shut_down:
            raise InvalidStateError("the manager is shut down")

    # -- memory layout -----------------------------------------------------------------------------

    def _placement(self, layer_id: int, role: str) -> BufferPlacement:
        """The caller holds the lock. Left to right, type before value (docs/errors.md): the layer
        id (an int, then a known layer), then the role (a str, then one of the layer's buffers)."""
        self._require_live()
        layer = as_int("layer_id", layer_id)
        if layer not in self._registry.layer_group_of:
            raise KeyError(f"no layer {layer}")
        return self._storage_config.placement(layer, as_str("role", role))

    def get_mem_pool_base_address(self, layer_id: int, role: str, index_mode: PageIndexMode | None = None) -> int:
        """The pool holding the buffer; in SHARED mode, plus the buffer's offset in a slot. No
        mode means PER_LAYER, except with scratch reuse configured, where the caller must say
        (scratch slots are addressed per layer)."""
        poison.check()
        with self._context.lock:
            p = self._placement(layer_id, role)
            if index_mode is None and self._config.swa_scratch_reuse is not None:
                raise ValueError("get_mem_pool_base_address: index_mode is required with swa_scratch_reuse")
            mode = PageIndexMode.PER_LAYER if index_mode is None else PageIndexMode(index_mode)
            base = (
                self._storage.pool_groups[self._storage_config.pool_group_of(p.layer_group)].pools[p.pool].base_address
            )
            return base + (p.position * p.size if mode == PageIndexMode.SHARED else 0)

    def get_page_stride(self, layer_id: int, role: str) -> int:
        poison.check()
        with self._context.lock:
            return self._placement(layer_id, role).page_size

    def get_page_index_converter(self, layer_id: int, role: str) -> PageIndexConverter:
        poison.check()
        with self._context.lock:
            p = self._placement(layer_id, role)
            return PageIndexConverter(p.scale, p.expansion, p.position, p.expansion)

    def get_page_index_upper_bound(self, layer_id: int, role: str) -> int:
        poison.check()
        with self._context.lock:
            p = self._placement(layer_id, role)
            num_slots = self._counts.slots[self._storage_config.pool_group_of(p.layer_group)]
            return (p.scale * num_slots - p.position) * p.expansion

    def get_buffer_location(self, layer_id: int, role: str) -> BufferLocation:
        poison.check()
        with self._context.lock:
            p = self._placement(layer_id, role)
            return BufferLocation(self._storage_config.pool_group_of(p.layer_group), p.pool, p.page_size)

    @property
    def pool_group_descs(self) -> list[PoolGroupDesc]:
        poison.check()
        with self._context.lock:
            self._require_live()
            return [
                PoolGroupDesc(
                    pg.index,
                    self._counts.slots[pg.index],
                    pg.life_cycles,
                    tuple(
                        PoolDesc(pool.base_address, pool.slot_size)
                        for pool in self._storage.pool_groups[pg.index].pools
                    ),
                )
                for pg in self._storage_config.pool_groups
            ]

    def pool_memory(self, pool_group: int, pool: int) -> memoryview:
        """Writable bytes of one pool (slot ``s`` at ``s * slot_size``), for CPU engines and tests."""
        poison.check()
        with self._context.lock:
            self._require_live()
            groups = self._storage.pool_groups
            g = int_in_range("pool_group", pool_group, 0)
            if g >= len(groups):
                raise IndexError(f"pool_group {g} out of range (0..{len(groups) - 1})")
            p = int_in_range("pool", pool, 0)
            if p >= len(groups[g].pools):
                raise IndexError(f"pool {p} out of range (0..{len(groups[g].pools) - 1})")
            return groups[g].pools[p].view()

    def get_quota(self, level: int = GPU_LEVEL) -> int:
        poison.check()
        with self._context.lock:
            lvl = self._check_level(level)
            self._require_live()
            return self._storage.levels[lvl].quota

    def _check_level(self, level: Any) -> int:
        lvl = int_in_range("level", level, 0)
        if lvl > self._storage.last:
            raise IndexError(f"level {lvl} out of range (0..{self._storage.last})")
        return lvl

    def resize(self, level: int, quota: int, best_efforts: bool = False) -> bool:
        """Change a level's quota with every cache suspended: shrink (evicting, then moving pages
        out of the slots that go), then grow. False, nothing changed, below the minimum quota or
        when the pages that must stay cannot fit."""
        poison.check()
        with self._context.lock:
            self._require_live()
            active = sum(1 for c in self._context.open_caches() if c.is_active)
            if active:
                raise InvalidStateError(f"resize() requires every KV cache suspended ({active} active)")
            lvl = self._check_level(level)
            q = int_in_range("quota", quota, 1, QUOTA_LIMIT)
            if not isinstance(best_efforts, bool):
                raise TypeError(f"best_efforts: expected a bool, got {type(best_efforts).__name__}")
            if best_efforts:
                raise NotImplementedError("resize: best_efforts=True is not supported")
            # The device keeps the split the auto-tuner gave it.
            ratio = self._context.rebalancer.applied if lvl == GPU_LEVEL else None
            with at_level(lvl):
                counts = SlotCounts(self._config, self._registry, self._storage_config, lvl, q, ratio)
            if q < counts.min_quota:
                return False
            return self._resize_level(lvl, counts)

    def _resize_level(self, level: int, counts: SlotCounts) -> bool:
        """Give a level new slot counts (every cache suspended); False, nothing changed, when the
        pages that must stay cannot fit."""
        try:
            with at_level(level):
                self._storage.resize_level(level, counts, self._live_pages())
        except OutOfPagesError:
            return False
        if level == GPU_LEVEL:
            self._counts = counts
            self._layout_version += 1  # the device's pools may have moved
        return True

    # -- the auto-tuner (rebalancer.py) ----------------------------------------------------------

    @property
    def layout_version(self) -> int:
        poison.check()
        with self._context.lock:
            self._require_live()
            return self._layout_version

    @property
    def need_adjustment(self) -> bool:
        """Whether ``adjust()`` is due: enough caches sampled, the cooldown over, and some pool
        group's device slots off the target split by more than the threshold factor."""
        poison.check()
        with self._context.lock:
            self._require_live()
            return self._context.rebalancer.need_adjustment(self._counts)

    def adjust(self) -> bool:
        """Re-split the device quota between pool groups by the learnt target ratio (minimum
        slots kept), with every cache suspended, as ``resize`` does. Whether any slot count
        changed; False with nothing changed when the pages that must stay cannot fit. Restarts
        the cooldown."""
        poison.check()
        with self._context.lock:
            self._require_live()
            active = sum(1 for c in self._context.open_caches() if c.is_active)
            if active:
                raise InvalidStateError(f"adjust() requires every KV cache suspended ({active} active)")
            rebalancer = self._context.rebalancer
            plan = rebalancer.plan(self._counts.quota)
            if plan is None:  # nothing learnt yet
                rebalancer.adjusted(None)
                return False
            unchanged = plan.slots == self._counts.slots
            applied = unchanged or self._resize_level(GPU_LEVEL, plan)
            rebalancer.adjusted(rebalancer.target if applied else None)
            return applied and not unchanged

    def _live_pages(self) -> list[Page]:
        """Every page the tree or an open cache has, each once."""
        pages: dict[int, Page] = {}
        for root in self._tree.roots.values():
            for child in root.children.values():
                for block in RadixTree.subtree(child):
                    pages.update((id(p), p) for p in block.pages if p is not None)
        for cache in self._context.open_caches():
            if isinstance(cache, KVCache):
                pages.update((id(p), p) for p in cache.held_pages())
        return list(pages.values())

    def get_storage_statistics(self, level: int = GPU_LEVEL) -> list[StorageStatistics]:
        poison.check()
        with self._context.lock:
            lvl = self._check_level(level)
            self._require_live()
            return self._storage.statistics(lvl)

    # -- statistics ----------------------------------------------------------------------------------

    def get_committed_stats(self) -> CacheStats:
        poison.check()
        with self._context.lock:
            return replace(
                self._context.committed_stats,
                evicted_pages=self._storage.num_evicted,
                onboarded_pages=self._storage.num_onboarded,
                corrupt_pages=self._storage.num_corrupt,
                disk_full_events=self._storage.num_disk_full,
            )

    def get_and_reset_iteration_stats(self) -> CacheStats:
        poison.check()
        with self._context.lock:
            stats = replace(
                self._context.iteration_stats,
                evicted_pages=self._storage.num_evicted - self._evicted_mark,
                onboarded_pages=self._storage.num_onboarded - self._onboarded_mark,
                corrupt_pages=self._storage.num_corrupt - self._corrupt_mark,
                disk_full_events=self._storage.num_disk_full - self._disk_full_mark,
            )
            self._context.reset_iteration_stats()
            self._evicted_mark = self._storage.num_evicted
            self._onboarded_mark = self._storage.num_onboarded
            self._corrupt_mark = self._storage.num_corrupt
            self._disk_full_mark = self._storage.num_disk_full
            return stats

    _evicted_mark = 0
    _onboarded_mark = 0
    _corrupt_mark = 0
    _disk_full_mark = 0

    def get_and_reset_iteration_stats_by_life_cycle(self) -> dict[int, LifeCycleStats]:
        poison.check()
        with self._context.lock:
            return self._stats.take_life_cycle_stats()

    def get_and_reset_ssm_snapshot_iteration_stats(self) -> SsmSnapshotStats:
        poison.check()
        with self._context.lock:
            return self._stats.take_ssm_stats()

    def get_and_reset_iteration_peak_block_stats(self, level: int = GPU_LEVEL) -> list[int]:
        poison.check()
        with self._context.lock:
            lvl = self._check_level(level)
            self._require_live()
            return [pg.allocator.take_peak() for pg in self._storage.levels[lvl].pool_groups]

    def mark_stats_excluded(self, cache_id: int) -> None:
        poison.check()
        with self._context.lock:
            i = int_in_range("cache_id", cache_id, 0, CACHE_ID_LIMIT)
            self._stats.excluded.add(i)
            for cache in self._context.open_caches():
                if isinstance(cache, KVCache) and cache.stats.cache_id == i:
                    cache.stats.excluded = True

    def is_stats_excluded(self, cache_id: int) -> bool:
        poison.check()
        with self._context.lock:
            return int_in_range("cache_id", cache_id, 0, CACHE_ID_LIMIT) in self._stats.excluded

    def mark_stats_dirty(self, cache_id: int) -> None:
        poison.check()
        with self._context.lock:
            self._stats.dirty.add(int_in_range("cache_id", cache_id, 0, CACHE_ID_LIMIT))

    def clear_stats_dirty(self, cache_id: int) -> None:
        poison.check()
        with self._context.lock:
            self._stats.dirty.discard(int_in_range("cache_id", cache_id, 0, CACHE_ID_LIMIT))

    def get_dirty_stats_kv_cache_ids(self) -> list[int]:
        poison.check()
        with self._context.lock:
            return sorted(self._stats.dirty)

    # -- sizing -------------------------------------------------------------------------------------

    def clamp_max_seq_len_for_mem(self, batch_size: int, token_upper_bound: int) -> int:
        """See ``slot_counts.clamp_max_seq_len``: against the device level's slots now."""
        poison.check()
        with self._context.lock:
            self._require_live()
            n = int_in_range("batch_size", batch_size, 1, TOKEN_LIMIT)
            bound = int_in_range("token_upper_bound", token_upper_bound, 0, TOKEN_LIMIT)
            return clamp_max_seq_len(self._registry, self._storage_config, self._counts.slots, n, bound)

    def get_bytes_moved(self) -> dict[tuple[int, int], int]:
        poison.check()
        with self._context.lock:
            return dict(self._storage.transfer.bytes_moved)

    # -- batched calls (batch.py) -------------------------------------------------------------

    def resize_many(self, caches: Any, capacities: Any) -> list[bool]:
        poison.check()
        with self._context.lock:
            self._require_live()
            return batch.resize_many(self, caches, capacities)

    def commit_many(self, caches: Any, tokens: Any, counts: Any, is_end: bool = False) -> None:
        poison.check()
        with self._context.lock:
            self._require_live()
            batch.commit_many(self, caches, tokens, counts, is_end, self._context.remote)

    def decode_steps(self, caches: Any, tokens: Any, steps: Any, until_room: Any = None) -> kv_api.DecodeSteps:
        poison.check()
        with self._context.lock:
            self._require_live()
            return batch.decode_steps(
                self,
                caches,
                tokens,
                steps,
                until_room,
                self._context.remote,
                lambda: self._storage.statistics(GPU_LEVEL),
            )

    def admit_many(
        self,
        reuse_scopes: Any,
        prompts: Any,
        ids: Any = None,
        priority_callbacks: Any = None,
        max_reused_tokens: Any = None,
    ) -> list[kv_api.KVCache]:
        poison.check()
        with self._context.lock:
            self._require_live()
            return batch.admit_many(self, reuse_scopes, prompts, ids, priority_callbacks, max_reused_tokens)

    @property
    def num_open_kv_caches(self) -> int:
        poison.check()
        with self._context.lock:
            return self._context.num_open_caches

    def _require_no_open_caches(self, api: str) -> None:
        if n := self._context.num_open_caches:
            raise LogicError(f"{api}() with {n} KV cache(s) still open")

    def clear_reusable_blocks(self) -> None:
        """Empty the radix tree (every committed page is freed). LogicError while caches are open."""
        poison.check()
        with self._context.lock:
            self._require_live()
            self._require_no_open_caches("clear_reusable_blocks")
            self._storage.clear()

    def shutdown(self) -> None:
        """Empty the tree; the manager is unusable afterwards (its memory goes with the object).
        LogicError while caches are open. Idempotent."""
        poison.check()
        with self._context.lock:
            if self._context.is_shut_down:
                return
            self._require_no_open_caches("shutdown")
            self._storage.clear()
            self._storage.close()
            self._context.is_shut_down = True
            self._live.release()
