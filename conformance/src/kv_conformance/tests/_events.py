"""Shared helpers for the wire-event tests: a manager with a publisher, hashes as the wire carries
them, and a bounded wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import kv_api
from kv_api import KVCacheEventManager, KVCacheManager, KVCacheManagerConfig, ReuseScope

if TYPE_CHECKING:  # kv-events is the suite's optional extra: only the wire tests import it
    from kv_events import EventPublisher

T = TypeVar("T")

#: How long a test waits for events to reach a consumer before it fails (the machine may be busy).
SETTLE_SECONDS = 20.0


def wire_hashes(tokens_per_block: int, tokens: list[int], scope: ReuseScope | None = None) -> list[int]:
    """The 64-bit (``v2_sha256_64``) hashes of the blocks of ``tokens``, block 0 first."""
    raw = kv_api.keys.block_keys(tokens_per_block, scope, tokens)
    return [int.from_bytes(raw[i : i + 8], "big") for i in range(32, len(raw), 32)]


def published(
    backend: kv_api.Backend, config: KVCacheManagerConfig, *, algo: str = "v2_sha256_64", replay: bool = True
) -> tuple[KVCacheManager, KVCacheEventManager, EventPublisher]:
    """A manager whose events a publisher on free loopback ports sends."""
    from kv_events import EventPublisher

    events = backend.KVCacheEventManager(100_000, algo)
    manager = backend.KVCacheManager(config, events)
    publisher = EventPublisher(
        events, config, "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*" if replay else None
    )
    return manager, events, publisher


def settle(what: str, probe: Callable[[], tuple[bool, T]], timeout: float = SETTLE_SECONDS) -> T:
    """Poll ``probe`` (ok, value) until ok; fail naming ``what`` and the last value after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        ok, value = probe()
        if ok:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not settled after {timeout}s; last: {value}")
        time.sleep(0.02)


def commit(manager: KVCacheManager, tokens: list[int]) -> None:
    """Admit ``tokens`` as an engine does (reusing the cached prefix), prefill, close."""
    cache = manager.create_kv_cache(None, tokens)
    assert cache.resume()
    assert cache.resize(len(tokens))
    cache.commit(tokens[cache.num_committed_tokens :])
    cache.close()
