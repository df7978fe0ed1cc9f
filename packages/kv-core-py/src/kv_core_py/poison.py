"""The poison latch (docs/errors.md, "The poison latch"): once an internal invariant is found
violated, the backend's state can no longer be trusted, so every later public call of a manager,
its caches and event managers raises ``CorruptedError`` naming the first violation, until every
manager is gone and ``take_poison()`` clears it. One latch per backend module, process-wide, as
the native backend's ``poison.{h,cc}``.
"""

from __future__ import annotations

import os
import threading
import weakref

from kv_api.errors import CorruptedError, LogicError

#: The environment variable that unlocks the debug hooks, read at each call.
DEBUG_HOOKS_ENV = "KV_DEBUG_HOOKS"

_lock = threading.Lock()
_reason: str | None = None
_live_managers = 0


def record(reason: str) -> None:
    """Poison the backend; the first reason wins (later ones are consequences of it)."""
    global _reason
    with _lock:
        if _reason is None:
            _reason = reason


def corrupted(reason: str) -> CorruptedError:
    """Record ``reason`` and return the error that reports it, for ``raise poison.corrupted(...)``."""
    record(reason)
    return CorruptedError(reason)


def check() -> None:
    """Raise ``CorruptedError`` naming the reason if the backend is poisoned: the first thing
    every public call does. Read without the lock: a str reference is read atomically."""
    reason = _reason
    if reason is not None:
        raise CorruptedError(f"kvcore is poisoned: {reason}")


def reason() -> str | None:
    """The recorded reason, or None; never clears it."""
    return _reason


def take() -> str | None:
    """Clear the latch and return its reason (None when not poisoned). Only with no manager
    alive: a live one may hold the broken state, so a ``LogicError`` says how many remain and
    the latch stays."""
    global _reason
    with _lock:
        if _reason is not None and _live_managers:
            raise LogicError(f"take_poison(): {_live_managers} manager(s) still alive")
        taken, _reason = _reason, None
        return taken


def num_live_managers() -> int:
    """Managers built and neither shut down nor collected."""
    return _live_managers


def _manager_gone() -> None:
    global _live_managers
    with _lock:
        _live_managers -= 1


class LiveManager:
    """Counts ``manager`` alive from now until ``release()`` (its shutdown) or its collection,
    whichever comes first: counted down once."""

    def __init__(self, manager: object) -> None:
        global _live_managers
        with _lock:
            _live_managers += 1
        # The callback must not refer to the manager, or it would never be collected.
        self._finalizer = weakref.finalize(manager, _manager_gone)

    def release(self) -> None:
        self._finalizer()  # a finalizer runs at most once


def debug_poison(reason: str) -> None:
    """Poison the backend as an internal invariant violation would (tests of the latch). Only
    with ``KV_DEBUG_HOOKS=1`` in the environment at the call, so no production path can."""
    if not isinstance(reason, str):
        raise TypeError(f"reason: expected a str, got {type(reason).__name__}")
    if os.environ.get(DEBUG_HOOKS_ENV) != "1":
        raise RuntimeError(f"_debug_poison: a debug hook, refused unless {DEBUG_HOOKS_ENV}=1")
    record(reason)
