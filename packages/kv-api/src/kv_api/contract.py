"""The backend contract: what every backend module, its manager, caches and event manager provide.

Backends register under the entry-point group ``kv_api.backends`` (see ``registry``). The
classes are ABCs so that ``isinstance(m, kv_api.KVCacheManager)`` holds for every backend:
Python backends subclass them, native ones are registered as virtual subclasses. Every public
member docs/manager.md documents is declared here; the conformance suite checks that every
backend implements each one with the same kind and signature. ``kv_api.create_manager`` builds
a manager on the default backend.
"""

from __future__ import annotations

import abc
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Protocol, SupportsIndex, TypeAlias, runtime_checkable

from kv_api.capabilities import Capabilities
from kv_api.config import KVCacheManagerConfig
from kv_api.constants import GPU_LEVEL, KVCacheStatus, PageIndexMode
from kv_api.descriptors import BufferLocation, LifeCycle, PageIndexConverter, PoolGroupDesc, ScratchDesc
from kv_api.events import KVCacheEvent
from kv_api.keys import Token
from kv_api.page_copier import PageCopier
from kv_api.scope import MmItemContext, ReuseScope
from kv_api.stats import (
    CacheStats,
    DecodeSteps,
    KVCacheStatsDelta,
    LifeCycleStats,
    ReuseMatch,
    ReuseReport,
    SsmSnapshotStats,
    StorageStatistics,
)

__all__ = [
    "BACKEND_ATTRIBUTES",
    "Backend",
    "Buffer",
    "DLPackTensor",
    "KVCache",
    "KVCacheEventManager",
    "KVCacheManager",
    "PlannedDropHandle",
    "PriorityCallback",
    "TokenInput",
]


class Buffer(Protocol):
    """An object exporting the buffer protocol (Python 3.12's ``collections.abc.Buffer``)."""

    def __buffer__(self, flags: int, /) -> memoryview: ...


class DLPackTensor(Protocol):
    """An object exporting DLPack (a torch tensor), accepted where an index buffer is
    (``kv_api.dlpack``)."""

    def __dlpack__(self) -> object: ...


#: Tokens as every call taking them accepts them (docs/key-format.md, "Token input"): an
#: iterable of ids (ints or ``__index__`` objects) and 32-byte digests, or a 1-D integer buffer.
TokenInput: TypeAlias = Iterable[SupportsIndex | bytes | MmItemContext] | Buffer
#: ``(block ordinal, life cycle) -> priority`` in [MIN_PRIORITY, MAX_PRIORITY], per new page.
PriorityCallback: TypeAlias = Callable[[int, LifeCycle], int]


class KVCacheEventManager(abc.ABC):
    """KV-cache events for KV-aware routers, fed by the one manager it is passed to.

    ``max_kv_event_entries`` bounds the ring of published events (<= 0 publishes nothing); a
    ring that would overflow drops its events and the queued ones (``dropped_events``) for a
    resync: ``Created``, then ``Stored`` for every announced chain of the manager's tree as it is
    now (docs/manager.md, "Events"). ``hash_algo`` is ``auto`` (= ``v1_block_key``) or one of
    ``kv_api.events.HASH_ALGOS``. Bad types raise ``TypeError``, an unknown algorithm
    ``ValueError``.
    """

    @abc.abstractmethod
    def __init__(self, max_kv_event_entries: int = 1000, hash_algo: str = "v2_sha256") -> None:
        """Backends check and keep the arguments."""

    @property
    @abc.abstractmethod
    def hash_algo(self) -> str:
        """The algorithm events are hashed with (``auto`` reads as ``v1_block_key``); read-only."""

    @property
    @abc.abstractmethod
    def max_kv_event_entries(self) -> int:
        """The bound of the ring of published events, as given; read-only."""

    @property
    @abc.abstractmethod
    def dropped_events(self) -> int:
        """Events dropped from a full ring since construction (each overflow resyncs)."""

    @abc.abstractmethod
    def flush_iteration_events(self) -> None:
        """Publish the queued events (buffered Removed hashes first) into the ring."""

    @abc.abstractmethod
    def get_latest_events(self, timeout_ms: float | None = 0) -> list[KVCacheEvent]:
        """Drain the ring; ``None`` waits for events, ``> 0`` waits at most that long."""


class KVCacheManager(abc.ABC):
    """Owns the paged pools, the radix tree of block keys, eviction, events and statistics.

    ``config`` must be a ``KVCacheManagerConfig`` (else ``TypeError``); ``event_manager`` must
    be the same backend's ``KVCacheEventManager`` (else ``TypeError``) and serves one manager
    only (``ValueError``); ``page_copier`` (a ``PageCopier``, else ``TypeError``) moves page
    bytes between memory levels (default: host-memory copies). Host/disk tiers, SSM layers and
    ``commit_min_snapshot`` raise ``NotImplementedError`` unless the backend's capabilities say
    otherwise. Every method is
    safe to call from several threads. After ``shutdown()`` every method but ``shutdown()``
    raises ``InvalidStateError`` (properties still read). The full semantics are in
    docs/manager.md.
    """

    @abc.abstractmethod
    def __init__(
        self,
        config: KVCacheManagerConfig,
        event_manager: KVCacheEventManager | None = None,
        page_copier: PageCopier | None = None,
    ) -> None:
        """Backends validate and keep ``config``."""

    # -- configuration and layer groups ----------------------------------------------------------

    @property
    @abc.abstractmethod
    def init_config(self) -> KVCacheManagerConfig:
        """The configuration the manager was built from."""

    @property
    @abc.abstractmethod
    def tokens_per_block(self) -> int:
        """Tokens per block, as configured."""

    @property
    @abc.abstractmethod
    def life_cycles(self) -> list[LifeCycle]:
        """One per layer group, indexed by its id."""

    @property
    @abc.abstractmethod
    def layer_grouping(self) -> list[list[int]]:
        """Layer ids per layer group (= life cycle), in config order."""

    @property
    @abc.abstractmethod
    def layer_ids(self) -> list[int]:
        """Every layer id, in config order."""

    @property
    @abc.abstractmethod
    def num_layers(self) -> int:
        """``len(layer_ids)``."""

    @abc.abstractmethod
    def get_layer_group_id(self, layer_id: int) -> int:
        """The layer group of ``layer_id``; ``KeyError`` for an unknown layer."""

    # -- memory layout ---------------------------------------------------------------------------

    @abc.abstractmethod
    def get_mem_pool_base_address(self, layer_id: int, role: str, index_mode: PageIndexMode | None = None) -> int:
        """Address of the pool holding the buffer; in SHARED mode plus its offset in a slot.
        ``None`` means PER_LAYER, and is a ``ValueError`` when the config has
        ``swa_scratch_reuse`` (the caller must choose a mode)."""

    @abc.abstractmethod
    def get_page_stride(self, layer_id: int, role: str) -> int:
        """Bytes between consecutive pages of the buffer."""

    @abc.abstractmethod
    def get_page_index_converter(self, layer_id: int, role: str) -> PageIndexConverter:
        """Maps base page indices (slots) to the buffer's page indices."""

    @abc.abstractmethod
    def get_page_index_upper_bound(self, layer_id: int, role: str) -> int:
        """Exclusive bound of the buffer's page indices."""

    @abc.abstractmethod
    def get_buffer_location(self, layer_id: int, role: str) -> BufferLocation:
        """The device pool holding the buffer and its page stride: its PER_LAYER page ``p`` is
        bytes ``[p * page_stride, (p + 1) * page_stride)`` of ``pool_memory(pool_group, pool)``
        (docs/manager.md, "Page addresses"). Errors as ``get_page_stride``'s."""

    @property
    @abc.abstractmethod
    def pool_group_descs(self) -> list[PoolGroupDesc]:
        """Every pool group: slots, life cycles and pools (base address, slot size)."""

    @abc.abstractmethod
    def pool_memory(self, pool_group: int, pool: int) -> memoryview:
        """Writable bytes of one pool (slot ``s`` at ``s * slot_size``); keeps the manager
        alive. ``IndexError`` for a bad pool group or pool."""

    @abc.abstractmethod
    def get_quota(self, level: int = GPU_LEVEL) -> int:
        """Effective quota of a cache level in bytes. ``IndexError`` for a level the manager lacks."""

    @abc.abstractmethod
    def resize(self, level: int, quota: int, best_efforts: bool = False) -> bool:
        """Change a level's quota (bytes) with every cache suspended (``InvalidStateError``
        otherwise): shrink first (evicting, then moving pages out of the slots that go), then
        grow; the level's pools may move (read their addresses again). False, with nothing
        changed, below the minimum quota or when the pages that must stay cannot fit;
        ``best_efforts=True`` raises ``NotImplementedError``."""

    @property
    @abc.abstractmethod
    def layout_version(self) -> int:
        """0 when built, +1 at every ``resize`` of the device level and every ``adjust()`` that
        took effect: the device's pools may have moved, so ``pool_memory`` views, addresses and
        tensors over them taken at another version are stale (read them again)."""

    @property
    @abc.abstractmethod
    def need_adjustment(self) -> bool:
        """The auto-tuner: whether ``adjust()`` is due (at least ``rebalance_min_sampled_kv_caches``
        caches sampled on close, ``rebalance_cooldown_secs`` since the manager was built or last
        adjusted, and some pool group's device slots off the learnt split by more than
        ``rebalance_ratio_threshold`` times either way)."""

    @abc.abstractmethod
    def adjust(self) -> bool:
        """Re-split the device quota between pool groups by the learnt target ratio (minimum
        slots kept) with every cache suspended (``InvalidStateError`` otherwise), as ``resize``
        moves pages. Whether any slot count changed (False, nothing changed, when the pages that
        must stay cannot fit); restarts the cooldown."""

    # -- statistics ----------------------------------------------------------------------------

    @abc.abstractmethod
    def get_storage_statistics(self, level: int = GPU_LEVEL) -> list[StorageStatistics]:
        """Slot accounting per pool group. ``IndexError`` for a level the manager lacks."""

    @abc.abstractmethod
    def get_committed_stats(self) -> CacheStats:
        """Counts since the manager was built."""

    @abc.abstractmethod
    def get_and_reset_iteration_stats(self) -> CacheStats:
        """Counts since the previous call, then start counting afresh."""

    @abc.abstractmethod
    def get_and_reset_iteration_stats_by_life_cycle(self) -> dict[int, LifeCycleStats]:
        """Counts per life cycle (every one a key) since the previous call, then afresh; its own
        counters, apart from ``get_and_reset_iteration_stats``'s."""

    @abc.abstractmethod
    def get_and_reset_ssm_snapshot_iteration_stats(self) -> SsmSnapshotStats:
        """SSM snapshots stored, skipped and reused since the previous call, then afresh."""

    @abc.abstractmethod
    def get_and_reset_iteration_peak_block_stats(self, level: int = GPU_LEVEL) -> list[int]:
        """Per pool group, the most slots of ``level`` in use (not free) at once since the
        previous call for that level (or since the manager was built); then starts from the
        slots in use now. ``IndexError`` for a level the manager lacks."""

    @abc.abstractmethod
    def mark_stats_excluded(self, cache_id: int) -> None:
        """Caches with this id (open ones, and ones created later) feed none of the manager's
        statistics from now on; their per-request stats still count."""

    @abc.abstractmethod
    def is_stats_excluded(self, cache_id: int) -> bool:
        """Whether ``mark_stats_excluded(cache_id)`` was called."""

    @abc.abstractmethod
    def mark_stats_dirty(self, cache_id: int) -> None:
        """Add ``cache_id`` to the dirty ids (caches with per-request stats to collect)."""

    @abc.abstractmethod
    def clear_stats_dirty(self, cache_id: int) -> None:
        """Remove ``cache_id`` from the dirty ids (absent: nothing happens)."""

    @abc.abstractmethod
    def get_dirty_stats_kv_cache_ids(self) -> list[int]:
        """The dirty ids, ascending: marked, or of caches whose pending per-request stats became
        non-zero and were not committed or discarded since."""

    @abc.abstractmethod
    def clamp_max_seq_len_for_mem(self, batch_size: int, token_upper_bound: int) -> int:
        """The largest multiple of ``tokens_per_block`` at most ``token_upper_bound`` such that
        ``batch_size - 1`` one-token requests and one request growing to that many tokens fit
        the device level's slots in every pool group; 0 if none does."""

    @abc.abstractmethod
    def get_bytes_moved(self) -> dict[tuple[int, int], int]:
        """Bytes of page data copied per ``(src_level, dst_level)`` since the manager was built
        (directions that moved nothing are absent)."""

    # -- reuse and caches -------------------------------------------------------------------------

    @abc.abstractmethod
    def probe_reuse(
        self,
        reuse_scope: ReuseScope | None = None,
        tokens: TokenInput | None = None,
        max_reused_tokens: int | None = None,
    ) -> int:
        """What ``create_kv_cache`` would reuse now (with the same ``max_reused_tokens``),
        without changing anything."""

    @abc.abstractmethod
    def probe_first_new_block_key(
        self, reuse_scope: ReuseScope | None, tokens: TokenInput | None, max_reused_tokens: int | None = None
    ) -> bytes | None:
        """Key of block ``probe_reuse // tokens_per_block`` over ``tokens``; None if that block
        would be partial or everything is reusable."""

    @abc.abstractmethod
    def probe_reuse_match(
        self,
        reuse_scope: ReuseScope | None = None,
        tokens: TokenInput | None = None,
        max_reused_tokens: int | None = None,
    ) -> ReuseMatch:
        """The match ``probe_reuse`` makes, with its diagnostics; changes nothing."""

    @abc.abstractmethod
    def create_kv_cache(
        self,
        reuse_scope: ReuseScope | None = None,
        input_tokens: TokenInput | None = None,
        id: int | None = None,
        custom_priority_callback: PriorityCallback | None = None,
        expected_prompt_length: int | None = None,
        text_only: bool | None = None,
        enable_request_stats: bool = False,
        max_reused_tokens: int | None = None,
    ) -> KVCache:
        """A SUSPENDED cache whose committed tokens are the reusable prefix of ``input_tokens``
        (held, not yet locked). ``custom_priority_callback`` sets each new page's eviction
        priority (default ``DEFAULT_PRIORITY``); reuse may raise a block's priority. Bad
        tokens: ``ValueError``/``TypeError`` as ``kv_api.keys``. ``expected_prompt_length``
        (default ``len(input_tokens)``) splits its allocations into prompt and generation ones
        in its per-request stats; ``text_only`` (default the config's) refuses digest tokens;
        ``enable_request_stats`` keeps per-request stats (``commit_pending_stats``).
        ``max_reused_tokens`` (an int >= 0) reuses at most that many tokens: the match is cut to
        it after the config's ``reuse_match_backoff``, then to what the pages allow (a hybrid's
        SSM snapshot, a window's pages). An engine passes ``len(prompt) - 1`` so that one
        prompt token is left to compute the first output token's logits from."""

    # Batched calls (docs/manager.md, "Batched calls"): exactly the single calls, in the given
    # order, in one call (one crossing into a native backend, which runs the batch without the
    # GIL). Each sequence argument is a list or a tuple (TypeError otherwise), copied when the
    # call starts. Every argument is checked first: a bad one raises and nothing changes (an
    # item's error is the single call's, with a note naming the item). Then the calls run in
    # order under the manager's lock; if call k raises, calls 0..k-1 took effect and k..n-1 did
    # not, and call k's exception propagates unchanged in class and message, with a note, and
    # ``batch_index`` (k) and ``batch_results`` (the results of calls 0..k-1) set on it.

    @abc.abstractmethod
    def resize_many(self, caches: Sequence[KVCache], capacities: Sequence[int | None]) -> list[bool]:
        """``caches[i].resize(capacities[i])`` for each i in order (one capacity each; None
        leaves it unchanged); their results. ``caches`` are this manager's (TypeError for
        another backend's, ValueError for another manager's); ``capacities`` has their length
        (ValueError)."""

    @abc.abstractmethod
    def commit_many(
        self, caches: Sequence[KVCache], tokens: TokenInput, counts: Sequence[int], is_end: bool = False
    ) -> None:
        """``caches[i].commit(its slice of tokens, is_end)`` for each i in order: ``tokens`` is
        every cache's tokens concatenated (one buffer, viewed in place, or one list), ``counts[i]``
        how many are cache i's (each an int >= 0; one per cache; they add up to ``len(tokens)``,
        else ValueError). Bad tokens raise as ``commit``'s do, positions counted in ``tokens``."""

    @abc.abstractmethod
    def decode_steps(
        self, caches: Sequence[KVCache], tokens: TokenInput, steps: int, until_room: Sequence[int] | None = None
    ) -> DecodeSteps:
        """Up to ``steps`` decode iterations of ``caches`` in one call, for a simulator whose
        tokens are known ahead (``kvcore replay``). Iteration ``k`` is exactly ``resize_many(caches,
        [max(c.capacity, c.num_committed_tokens + 1) for c in caches])`` (the capacities read
        before it), then, if every resize succeeded, ``commit_many(caches, tokens[k * n:(k + 1) *
        n], [1] * n)`` with ``n = len(caches)``: ``tokens`` (one buffer or one list, as
        ``commit_many``'s) holds ``steps * n`` tokens, iteration by iteration (ValueError
        otherwise). It stops at the first iteration whose resizes did not all succeed (those that
        did stand; nothing of it is committed). With ``until_room`` (one int >= 0 per pool group,
        ValueError otherwise) it also stops after an iteration that leaves some pool group with
        more free + evictable slots at the device level than ``until_room`` gives it (what a
        request waiting for room would retry on). ``steps`` is an int >= 0. A call that raises
        ends it: the iterations before took effect, and the exception is that batched call's,
        with a further note naming the iteration. No events are flushed in between."""

    @abc.abstractmethod
    def admit_many(
        self,
        reuse_scopes: Sequence[ReuseScope | None],
        prompts: Sequence[TokenInput | None],
        ids: Sequence[int | None] | None = None,
        priority_callbacks: Sequence[PriorityCallback | None] | None = None,
        max_reused_tokens: Sequence[int | None] | None = None,
    ) -> list[KVCache]:
        """``create_kv_cache(reuse_scopes[i], prompts[i], ids[i], priority_callbacks[i],
        max_reused_tokens=max_reused_tokens[i])`` for each i in order: SUSPENDED caches holding
        their reusable prefixes, not resumed (the caller resumes each when it schedules it).
        ``ids``, ``priority_callbacks`` and ``max_reused_tokens``, when given, have one item per
        prompt (None: the default for every prompt)."""

    @property
    @abc.abstractmethod
    def num_open_kv_caches(self) -> int:
        """Caches created and not yet closed."""

    @abc.abstractmethod
    def clear_reusable_blocks(self) -> None:
        """Empty the radix tree. ``LogicError`` (changing nothing) while caches are open."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Empty the tree and retire the manager. Pool memory lives as long as the manager
        object (and any ``pool_memory`` view of it). ``LogicError`` (changing nothing) while
        caches are open. Idempotent."""


class PlannedDropHandle(abc.ABC):
    """A plan to drop the tree pages only a finished request's next turn would reuse, returned by
    ``KVCache.plan_committed_block_drop()`` (docs/manager.md, "Planned drops"). Each page it
    covers counts the plans outstanding on it; ``drop()`` applies this one. Applied when the
    handle is released (collected, or at the end of a ``with`` block) if not dropped before.
    """

    @abc.abstractmethod
    def drop(self) -> None:
        """Withdraw the plan from each covered page still alive: a page no other plan covers that
        nobody holds is dropped now, as an eviction would drop it (``Removed`` events). A second
        call raises ``LogicError``."""

    @abc.abstractmethod
    def __enter__(self) -> PlannedDropHandle:
        """The handle itself."""

    @abc.abstractmethod
    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """``drop()`` unless dropped already."""


class KVCache(abc.ABC):
    """One request's view of the cache: SUSPENDED on creation, ACTIVE after ``resume()``,
    CLOSED after ``close()``. Calls made in a state that does not allow them raise
    ``kv_api.errors.InvalidStateError`` and change nothing. Lengths always satisfy
    ``num_committed_tokens <= history_length <= capacity`` and
    ``num_blocks == ceil(capacity / tokens_per_block)``. Dropping the last reference to an open
    cache closes it.
    """

    # -- state and lengths -----------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def manager(self) -> KVCacheManager:
        """The manager that created the cache."""

    @property
    @abc.abstractmethod
    def id(self) -> int:
        """The ``id`` given to ``create_kv_cache``, else one above the largest id the manager
        has given so far (0 first); read-only."""

    @property
    @abc.abstractmethod
    def reuse_scope(self) -> ReuseScope:
        """The scope the cache was created in (``ReuseScope()`` for None); read-only."""

    @property
    @abc.abstractmethod
    def num_reused_tokens(self) -> int:
        """Tokens reused when the cache was created (its first ``num_committed_tokens``); read-only."""

    @property
    @abc.abstractmethod
    def status(self) -> KVCacheStatus:
        """ACTIVE, SUSPENDED or CLOSED."""

    @property
    @abc.abstractmethod
    def is_active(self) -> bool:
        """``status == ACTIVE``."""

    @property
    @abc.abstractmethod
    def tokens_per_block(self) -> int:
        """The manager's tokens per block."""

    @property
    @abc.abstractmethod
    def beam_width(self) -> int:
        """Beams per request (1)."""

    @property
    @abc.abstractmethod
    def num_committed_tokens(self) -> int:
        """``len(committed_tokens)``."""

    @property
    @abc.abstractmethod
    def committed_tokens(self) -> list[Token]:
        """The reused and committed tokens, in order (ints and 32-byte digests)."""

    @property
    @abc.abstractmethod
    def history_length(self) -> int:
        """Tokens whose KV is computed (committed or not)."""

    @history_length.setter
    @abc.abstractmethod
    def history_length(self, value: int) -> None:
        """``resize(None, value)``, raising ``OutOfPagesError`` where that returns False."""

    @property
    @abc.abstractmethod
    def capacity(self) -> int:
        """Tokens the cache has pages for."""

    @capacity.setter
    @abc.abstractmethod
    def capacity(self, value: int) -> None:
        """``resize(value)``, raising ``OutOfPagesError`` where that returns False;
        ``ValueError`` while sliding-window scratch reuse is enabled."""

    @property
    @abc.abstractmethod
    def num_blocks(self) -> int:
        """``ceil(capacity / tokens_per_block)``."""

    # -- the state machine -------------------------------------------------------------------------

    @abc.abstractmethod
    def resume(self, stream: object | None = None) -> bool:
        """SUSPENDED -> ACTIVE, locking the cache's pages. False (nothing changed) if a pool
        group's utilisation exceeds ``max_util_for_resume`` or pages run out. The first resume
        copies a reused partial block into private pages (the tree's are never written)."""

    @abc.abstractmethod
    def prefetch(self, target_level: int = GPU_LEVEL) -> bool:
        """SUSPENDED only: move the pages ``resume()`` would lock that sit below ``target_level``
        up to it, all or nothing. False (nothing changed) when room cannot be made;
        ``IndexError`` for a level the manager lacks."""

    @property
    @abc.abstractmethod
    def cached_tokens_by_level(self) -> list[int]:
        """Per cache level, the reused tokens that were found there when the cache was created."""

    @property
    @abc.abstractmethod
    def reuse_report(self) -> ReuseReport | None:
        """Why each prompt token was or was not reused when the cache was created (None with
        ``reuse_report=False``)."""

    @abc.abstractmethod
    def suspend(self) -> None:
        """ACTIVE -> SUSPENDED: pages stay held but unlocked (page indices read -1)."""

    @abc.abstractmethod
    def resize(self, capacity: int | None = None, history_length: int | None = None) -> bool:
        """ACTIVE only. ``ValueError`` if history would decrease or capacity drop below it, or
        (scratch reuse enabled, capacity changing) the new history is outside
        ``[old capacity - max_rewind_len, old capacity]``. False, with nothing changed, when
        pages run out."""

    @abc.abstractmethod
    def commit(self, tokens: TokenInput, is_end: bool = False) -> None:
        """ACTIVE only: record computed tokens; full blocks enter the radix tree. A block the
        tree already holds (another request committed the same tokens) **rebases** the cache
        onto the tree's page and frees its own: the block's base page index changes, so an
        engine re-reads the indices after every commit (or keeps a ``set_base_page_index_buf``
        buffer, which kvcore updates). ``ValueError``
        beyond capacity; ``LogicError`` after ``stop_committing()``. ``is_end`` then stops
        committing. With ``commit_min_snapshot`` the history must equal the committed count
        before or after the call (else ``LogicError``, nothing changed), and the state reusable
        at the new length (a partial tail's attention pages, the SSM state) is copied into the
        tree; with ``is_end`` the live pages move there instead (docs/manager.md)."""

    @abc.abstractmethod
    def stop_committing(self) -> None:
        """Commit the partial tail block and accept no further commits. Idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """``stop_committing()``, then release every page; committed pages stay reusable until
        evicted, the others are freed. Idempotent."""

    @abc.abstractmethod
    def plan_committed_block_drop(self) -> PlannedDropHandle | None:
        """After ``stop_committing()`` (else ``LogicError``): a plan covering the tree pages of the
        committed tokens that only their exact continuation reuses, the window pages of the
        trailing blocks and the last block's SSM snapshot (never full attention nor sinks).
        None when nothing is committed, or when the committed tokens, re-matched ignoring
        ``reuse_match_backoff``, are not all reusable."""

    # -- page indices --------------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def expected_prompt_length(self) -> int:
        """As given to ``create_kv_cache`` (default: the input tokens)."""

    @property
    @abc.abstractmethod
    def text_only(self) -> bool:
        """Whether the cache refuses digest tokens (``create_kv_cache``'s, else the config's)."""

    @abc.abstractmethod
    def commit_pending_stats(self) -> KVCacheStatsDelta:
        """The per-request stats accumulated since the last call (or creation), then zero; the
        id leaves the dirty ids. ``LogicError`` unless created with ``enable_request_stats``.
        Works on a closed cache too."""

    @abc.abstractmethod
    def discard_pending_stats(self) -> None:
        """Zero the pending per-request stats; the id leaves the dirty ids. ``LogicError``
        unless created with ``enable_request_stats``."""

    @abc.abstractmethod
    def get_base_page_indices(self, layer_group: int, beam: int = 0) -> array[int]:
        """``array('i')``: one slot id per block, ``BAD_PAGE_INDEX`` where no page is locked.
        ``IndexError`` for a bad layer group or beam."""

    @abc.abstractmethod
    def get_ssm_block_base_index(self, layer_group: int) -> int:
        """The slot of the request's state in an SSM layer group while the cache is active,
        else (suspended, or not an SSM group) ``BAD_PAGE_INDEX``. ``IndexError`` for a bad
        layer group."""

    @abc.abstractmethod
    def get_page_levels(self, layer_group: int, beam: int = 0) -> array[int]:
        """``array('i')``: per block, the cache level of the cache's page (-1 where it has none).
        ``IndexError`` for a bad layer group or beam."""

    @abc.abstractmethod
    def get_aggregated_page_indices(self, layer_group: int, beam: int = 0, valid_only: bool = False) -> array[int]:
        """The same indices; ``valid_only`` leaves out ``BAD_PAGE_INDEX``."""

    @abc.abstractmethod
    def set_base_page_index_buf(self, beam: int, layer_group: int, buf: Buffer | DLPackTensor | None) -> None:
        """Keep ``buf`` (writable, 1-D, contiguous int32, at least ``num_blocks`` long: a buffer
        or a CPU DLPack tensor such as a torch ``int32`` tensor, viewed in place) equal to
        the layer group's page indices, its tail past ``num_blocks`` set to -1; a resize that
        would outgrow it raises ``ValueError``. ``None`` detaches."""

    # -- sliding-window scratch (docs/manager.md, "Sliding-window scratch") -------------------------

    @property
    @abc.abstractmethod
    def enable_swa_scratch_reuse(self) -> bool:
        """Whether this cache uses scratch slots; on by default when the config has
        ``swa_scratch_reuse``."""

    @enable_swa_scratch_reuse.setter
    @abc.abstractmethod
    def enable_swa_scratch_reuse(self, value: bool) -> None:
        """``ValueError`` when turned on without ``swa_scratch_reuse`` in the config, or changed
        while the cache has scratch blocks (at its current lengths, either way)."""

    @property
    @abc.abstractmethod
    def has_scratch_slots(self) -> bool:
        """Whether the cache holds scratch slots now (active, with scratch blocks)."""

    @abc.abstractmethod
    def get_scratch_desc(self, layer_group: int) -> ScratchDesc | None:
        """The layer group's scratch blocks and the slots they share, while it has scratch
        slots; else None. ``IndexError`` for a bad layer group."""

    @abc.abstractmethod
    def supports_index_mode(self, mode: PageIndexMode) -> bool:
        """PER_LAYER always; SHARED only while the cache has no scratch slots."""


# Module-level names for the annotations below: inside ``Backend`` the class names are its attributes.
_ManagerClass: TypeAlias = type[KVCacheManager]
_EventManagerClass: TypeAlias = type[KVCacheEventManager]


@runtime_checkable
class Backend(Protocol):
    """What a backend module exposes (the entry point loads the module itself)."""

    name: str
    version: str
    #: The default backend is the loadable one with the highest priority (ties: name order).
    priority: int
    capabilities: Capabilities
    KVCacheManager: _ManagerClass
    KVCacheEventManager: _EventManagerClass

    def build_info(self) -> dict[str, str]:
        """Diagnostics shown in test headers: compiler, flags, SHA-256 transform, ..."""
        ...

    def reuse_scope_to_bytes(self, reuse_scope: ReuseScope | None) -> bytes: ...

    def sequence_to_blockchain_keys(
        self, tokens_per_block: int, reuse_scope: ReuseScope | None, tokens: TokenInput, key_format: str = ...
    ) -> Iterator[tuple[list[Token], bytes]]: ...

    def block_keys(
        self, tokens_per_block: int, reuse_scope: ReuseScope | None, tokens: TokenInput, key_format: str = ...
    ) -> bytes: ...

    def block_keys_many(
        self,
        tokens_per_block: int,
        reuse_scopes: Sequence[ReuseScope | None] | None,
        token_inputs: Sequence[TokenInput],
        key_format: str = ...,
    ) -> list[bytes]:
        """``block_keys`` of each input (one scope per input; None: ``ReuseScope()`` for all).
        Everything is checked before any hashing; an item's error names it (docs/key-format.md,
        "Many chains"). The native backend hashes independent chains four at a time, interleaved."""
        ...

    def gen_multimodal_cache_key_tokens(
        self, id_offset: int, digest: bytes, num_tokens: int, token_offset: int = ..., uuid: str | None = ...
    ) -> list[Token | MmItemContext]: ...

    def cache_salt_to_id(self, cache_salt: str) -> int: ...

    def block_hash_v2_sha256(self, key: bytes) -> str: ...

    def block_hash_v2_sha256_64(self, key: bytes) -> int: ...

    def block_hash_v1(self, tokens: Iterable[int], parent_hash: int, reuse_scope: ReuseScope | None = ...) -> int: ...

    # The poison latch (docs/errors.md): once an internal invariant is found violated, every later
    # public call of the backend's managers, caches and event managers (constructors included)
    # raises ``CorruptedError`` naming the first violation. One latch per backend, process-wide.

    def poison_reason(self) -> str | None:
        """The first recorded violation, or None; reading never clears it."""
        ...

    def take_poison(self) -> str | None:
        """Clear the latch and return its reason (None when not poisoned). ``LogicError``, the
        latch kept, while ``num_live_managers()`` is not 0."""
        ...

    def num_live_managers(self) -> int:
        """The backend's managers built and neither shut down nor destroyed (collected)."""
        ...


#: Everything a backend module must expose (``Backend``'s members, read off it so that they are
#: listed once): its attributes, then its functions. The registry checks these when it loads one.
BACKEND_ATTRIBUTES: tuple[str, ...] = (
    *Backend.__annotations__,
    *(name for name, member in vars(Backend).items() if callable(member) and not name.startswith("_")),
)
