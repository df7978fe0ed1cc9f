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

__all__ = ["BACKEND_ATTRIBUTES", "Backend", "KVCache", "KVCacheManager"]

#: Everything a backend module must expose; the registry checks these when it loads one.
BACKEND_ATTRIBUTES = (
    "name",
    "version",
    "capabilities",
    "build_info",
    "KVCacheManager",
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
    ``KVCacheManagerConfig`` (else ``TypeError``); the manager keeps its own copy.
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


class KVCache(abc.ABC):
    """One request's view of the cache: SUSPENDED on creation, ACTIVE after ``resume()``,
    CLOSED after ``close()``. Calls made in a state that does not allow them raise
    ``kv_api.errors.InvalidStateError``. Built by ``KVCacheManager.create_kv_cache``.
    """

    @abc.abstractmethod
    def close(self) -> None:
        """Release every page the cache holds; committed pages stay reusable. Idempotent."""


@runtime_checkable
class Backend(Protocol):
    """What a backend module exposes (the entry point loads the module itself)."""

    name: str
    version: str
    capabilities: Capabilities
    KVCacheManager: type

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
