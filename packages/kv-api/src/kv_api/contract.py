"""The backend contract: what every backend module and its manager provide.

Backends register under the entry-point group ``kv_api.backends`` (see ``registry``). The
manager contract is an ABC so that ``isinstance(m, kv_api.KVCacheManager)`` holds for every
backend: Python backends subclass it, native ones are registered as virtual subclasses.
Calling ``kv_api.KVCacheManager(config)`` builds the default backend's manager.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from kv_api.capabilities import Capabilities
from kv_api.config import KVCacheManagerConfig
from kv_api.keys import Token
from kv_api.scope import ReuseScope
from kv_api.stats import StorageStatistics

__all__ = ["BACKEND_ATTRIBUTES", "Backend", "KVCache", "KVCacheManager"]

#: Everything a backend module must expose; the registry checks these when it loads one.
BACKEND_ATTRIBUTES = (
    "name",
    "version",
    "capabilities",
    "build_info",
    "KVCacheManager",
    "KVCacheEventManager",
    "reuse_scope_to_bytes",
    "sequence_to_blockchain_keys",
    "block_keys",
    "gen_multimodal_cache_key_tokens",
    "cache_salt_to_id",
    "block_hash_v2_sha256",
    "block_hash_v2_sha256_64",
    "block_hash_v1",
)


class _DefaultBackendFactory(abc.ABCMeta):
    """Calling the ABC itself builds the default backend's manager instead of failing."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is KVCacheManager:
            from kv_api.registry import load_backend

            return load_backend().KVCacheManager(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class KVCacheManager(metaclass=_DefaultBackendFactory):
    """Owns the paged pools, the radix tree of block keys, eviction, events and statistics.

    ``KVCacheManager(config, event_manager=None)``: ``config`` must be a
    ``KVCacheManagerConfig`` (else ``TypeError``); ``event_manager`` must be the same backend's
    ``KVCacheEventManager`` (else ``TypeError``) and serves one manager only (``ValueError``).
    Host/disk tiers and ``commit_min_snapshot`` raise ``NotImplementedError`` unless the
    backend's capabilities say otherwise. Every method is safe to call from several threads.
    After ``shutdown()`` every call but ``shutdown()`` raises ``InvalidStateError``.
    The full semantics are in docs/manager.md.
    """

    def __init__(self, config: KVCacheManagerConfig, event_manager: Any = None) -> None:
        """Backends validate and keep ``config``; this base only fixes the signature."""

    @property
    @abc.abstractmethod
    def init_config(self) -> KVCacheManagerConfig:
        """The configuration the manager was built from."""

    @property
    @abc.abstractmethod
    def tokens_per_block(self) -> int:
        """Tokens per block, as configured."""

    @abc.abstractmethod
    def create_kv_cache(
        self,
        reuse_scope: ReuseScope | None = None,
        input_tokens: Any = None,
        id: int | None = None,
        custom_priority_callback: Any = None,
    ) -> KVCache:
        """A SUSPENDED cache whose committed tokens are the reusable prefix of ``input_tokens``
        (held, not yet locked). ``custom_priority_callback(ordinal, LifeCycle) -> int`` in
        [0, 100] sets each new page's eviction priority (default 35); reuse may raise a block's
        priority. Bad tokens: ``ValueError``/``TypeError`` as ``kv_api.keys``."""

    @abc.abstractmethod
    def probe_reuse(self, reuse_scope: ReuseScope | None = None, tokens: Any = None) -> int:
        """What ``create_kv_cache`` would reuse now, without changing anything."""

    @abc.abstractmethod
    def probe_first_new_block_key(self, reuse_scope: ReuseScope | None, tokens: Any) -> bytes | None:
        """Key of block ``probe_reuse // tokens_per_block`` over ``tokens``; None if that block
        would be partial or everything is reusable."""

    @abc.abstractmethod
    def get_storage_statistics(self, level: int = 0) -> list[StorageStatistics]:
        """Slot accounting per pool group. ``IndexError`` for a level the manager lacks."""

    @abc.abstractmethod
    def clear_reusable_blocks(self) -> None:
        """Empty the radix tree. ``LogicError`` (changing nothing) while caches are open."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Empty the tree and retire the manager: every later call but ``shutdown()`` raises
        ``InvalidStateError``. Pool memory lives as long as the manager object (and any
        ``pool_memory`` view of it). ``LogicError`` (changing nothing) while caches are open."""


class KVCache(abc.ABC):
    """One request's view of the cache: SUSPENDED on creation, ACTIVE after ``resume()``,
    CLOSED after ``close()``. Calls made in a state that does not allow them raise
    ``kv_api.errors.InvalidStateError`` and change nothing. Lengths always satisfy
    ``num_committed_tokens <= history_length <= capacity`` and
    ``num_blocks == ceil(capacity / tokens_per_block)``.
    """

    @abc.abstractmethod
    def resume(self, stream: Any = None) -> bool:
        """SUSPENDED -> ACTIVE, locking the cache's pages. False (nothing changed) if a pool
        group's utilisation exceeds ``max_util_for_resume`` or pages run out. The first resume
        copies a reused partial block into private pages (the tree's are never written)."""

    @abc.abstractmethod
    def suspend(self) -> None:
        """ACTIVE -> SUSPENDED: pages stay held but unlocked (page indices read -1)."""

    @abc.abstractmethod
    def resize(self, capacity: int | None = None, history_length: int | None = None) -> bool:
        """ACTIVE only. ``ValueError`` if history would decrease or capacity drop below it.
        False, with nothing changed, when pages run out."""

    @abc.abstractmethod
    def commit(self, tokens: Any, is_end: bool = False) -> None:
        """ACTIVE only: record computed tokens; full blocks enter the radix tree. ``ValueError``
        beyond capacity; ``LogicError`` after ``stop_committing()``."""

    @abc.abstractmethod
    def stop_committing(self) -> None:
        """Commit the partial tail block and accept no further commits. Idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """``stop_committing()``, then release every page; committed pages stay reusable until
        evicted, the others are freed. Idempotent."""

    @abc.abstractmethod
    def get_base_page_indices(self, layer_group: int, beam: int = 0) -> Any:
        """``array('i')``: one slot id per block, ``BAD_PAGE_INDEX`` where no page is locked.
        ``IndexError`` for a bad layer group or beam."""


@runtime_checkable
class Backend(Protocol):
    """What a backend module exposes (the entry point loads the module itself)."""

    name: str
    version: str
    capabilities: Capabilities
    KVCacheManager: type
    KVCacheEventManager: type

    def build_info(self) -> dict[str, str]:
        """Diagnostics shown in test headers: compiler, flags, SHA-256 transform, ..."""
        ...

    def reuse_scope_to_bytes(self, reuse_scope: ReuseScope | None) -> bytes: ...

    def sequence_to_blockchain_keys(
        self, tokens_per_block: int, reuse_scope: ReuseScope | None, tokens: Any, key_format: str = ...
    ) -> Iterator[tuple[list[Token], bytes]]: ...

    def block_keys(
        self, tokens_per_block: int, reuse_scope: ReuseScope | None, tokens: Any, key_format: str = ...
    ) -> bytes: ...

    def gen_multimodal_cache_key_tokens(
        self, id_offset: int, digest: bytes, num_tokens: int, token_offset: int = ..., uuid: str | None = ...
    ) -> list[Any]: ...

    def cache_salt_to_id(self, cache_salt: str) -> int: ...

    def block_hash_v2_sha256(self, key: bytes) -> str: ...

    def block_hash_v2_sha256_64(self, key: bytes) -> int: ...

    def block_hash_v1(self, tokens: Any, parent_hash: int, reuse_scope: ReuseScope | None = ...) -> int: ...
