"""Event-manager behaviour that mutation testing of the Python backend (docs/mutation.md) found
unchecked: the messages of a non-str ``hash_algo`` and of an event manager given to a second
manager, and a short positive ``timeout_ms`` that waits. Every backend must pass them."""

from __future__ import annotations

import time
from typing import Any

import pytest

import kv_api

from ._manager import make_config, make_manager, raises_exactly


@pytest.mark.parametrize("algo", [3, None, b"v2_sha256"])
def test_a_hash_algo_that_is_no_str_is_named(backend: kv_api.Backend, algo: Any) -> None:
    err = raises_exactly(TypeError, lambda: backend.KVCacheEventManager(16, algo))
    assert str(err) == f"hash_algo: expected a str, got {type(algo).__name__}"


def test_an_event_manager_serves_one_manager(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(16)
    make_manager(backend, make_config(), events)
    err = raises_exactly(ValueError, lambda: make_manager(backend, make_config(), events))
    assert str(err) == "event_manager: already used by another KVCacheManager"


@pytest.mark.parametrize("timeout_ms", [1, 0.5])
def test_a_short_timeout_waits_it_out_when_nothing_is_published(backend: kv_api.Backend, timeout_ms: float) -> None:
    """Any positive timeout, however short, is waited for (at least that long) when no event
    is there."""
    events = backend.KVCacheEventManager(16)
    events.get_latest_events()  # nothing published, no manager: empty
    start = time.monotonic()
    assert events.get_latest_events(timeout_ms) == []
    assert time.monotonic() - start >= timeout_ms / 1000
