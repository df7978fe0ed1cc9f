"""Hostile token containers: a list that one of its own tokens grows, empties or rewrites while
it is read, and buffers that are refused. Every backend reads the list as a Python loop would
(its length re-read at each item), never crashes, and releases every buffer it refused."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kv_api
from kv_api import keys as ref

from ._manager import make_config, toks


class Grow:
    """A token whose ``__index__`` appends ``n`` ones to its own list."""

    def __init__(self, tokens: list[Any], n: int) -> None:
        self.tokens, self.n = tokens, n

    def __index__(self) -> int:
        self.tokens.extend([1] * self.n)
        return 1


class Clear:
    """A token whose ``__index__`` empties its own list (dropping itself)."""

    def __init__(self, tokens: list[Any]) -> None:
        self.tokens = tokens

    def __index__(self) -> int:
        self.tokens.clear()
        return 2


class Rewrite:
    """A token whose ``__index__`` replaces every item of its list by a fresh object."""

    def __init__(self, tokens: list[Any]) -> None:
        self.tokens = tokens

    def __index__(self) -> int:
        self.tokens[:] = [object() for _ in self.tokens]  # frees the items being read, itself too
        return 3


def hostile(kind: str) -> list[Any]:
    """A fresh list of ``kind``; each call builds a new one (the first read mutates it)."""
    tokens: list[Any] = [5, 6, 7, 0, 8, 9, 10, 11]
    tokens[3] = {"grow": lambda: Grow(tokens, 100_000), "grow-little": lambda: Grow(tokens, 3)}.get(
        kind, lambda: Clear(tokens) if kind == "clear" else Rewrite(tokens)
    )()
    return tokens


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("value", call())
    except Exception as exc:  # noqa: BLE001 - the class is what the backends must agree on
        return ("raised", type(exc))


KINDS = ["grow", "grow-little", "clear", "rewrite"]


@pytest.mark.parametrize("kind", KINDS)
def test_block_keys_read_a_mutating_list_as_python_does(backend: kv_api.Backend, kind: str) -> None:
    assert outcome(lambda: backend.block_keys(4, None, hostile(kind))) == outcome(
        lambda: ref.block_keys(4, None, hostile(kind))
    )


def manager_outcomes(backend: kv_api.Backend, kind: str) -> list[Any]:
    """Every manager call that reads tokens, each given a fresh hostile list."""
    manager = backend.KVCacheManager(make_config(slots=64))
    cache = manager.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(64)
    cache.commit(toks(8, 5))
    cache.close()
    seen = [
        outcome(lambda: manager.probe_reuse(None, hostile(kind))),
        outcome(lambda: manager.probe_first_new_block_key(None, hostile(kind))),
    ]
    created = outcome(lambda: manager.create_kv_cache(None, hostile(kind)))
    if created[0] == "raised":
        return [*seen, created]
    cache = created[1]
    seen.append(cache.num_committed_tokens)
    assert cache.resume() and cache.resize(cache.num_committed_tokens + 8)
    before = cache.committed_tokens
    seen.append(outcome(lambda: cache.commit(hostile(kind))))
    if seen[-1][0] == "raised":
        assert cache.committed_tokens == before  # a refused commit changes nothing
    seen.append(cache.committed_tokens)
    cache.close()
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_the_manager_reads_a_mutating_list_alike_on_every_backend(backends: list[kv_api.Backend], kind: str) -> None:
    results = [manager_outcomes(b, kind) for b in backends]
    assert all(r == results[0] for r in results[1:])


REFUSED: dict[str, Callable[[], Any]] = {
    "bytearray": lambda: bytearray(16),
    "float64": lambda: np.zeros(4, dtype=np.float64),
    "2-D int32": lambda: np.zeros((2, 2), dtype=np.int32),
    "int32 holding -1": lambda: np.array([3, -1], dtype=np.int32),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_buffer_is_released(backend: kv_api.Backend, name: str) -> None:
    buffer = REFUSED[name]()
    manager = backend.KVCacheManager(make_config(slots=16))
    before = sys.getrefcount(buffer)
    for call in (
        lambda: backend.block_keys(4, None, buffer),
        lambda: manager.probe_reuse(None, buffer),
        lambda: manager.create_kv_cache(None, buffer),
    ):
        for _ in range(3):
            with pytest.raises((TypeError, ValueError)):
                call()
    assert sys.getrefcount(buffer) == before  # nothing kept: not the object, not an export
    if isinstance(buffer, bytearray):
        buffer.extend(b"x")  # an export still held would make this a BufferError
