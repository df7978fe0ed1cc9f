"""The one exception hierarchy every backend raises (see docs/errors.md).

Argument errors are Python's builtins (``ValueError``, ``TypeError``, ``IndexError``,
``KeyError``); everything specific to the cache lives here so that ``except`` clauses
work the same whichever backend is loaded.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CacheCapacityError",
    "CorruptedError",
    "DiskOOMError",
    "HostOOMError",
    "InvalidStateError",
    "LogicError",
    "OutOfMemoryError",
    "OutOfPagesError",
]


class CacheCapacityError(Exception):
    """The cache could not provide the memory a call needed."""


class OutOfPagesError(CacheCapacityError):
    """Not enough free or evictable slots in a pool group."""


class OutOfMemoryError(CacheCapacityError):
    """A memory tier could not allocate its backing store. Raised by a cache level (built, or
    rebuilt by a quota resize), it carries the level's index as ``level``, as does a disk
    level's ``OSError`` (docs/errors.md, "Which level")."""


class HostOOMError(OutOfMemoryError):
    """Host memory could not be allocated."""


class DiskOOMError(OutOfMemoryError):
    """The disk tier could not allocate or grow its files (reserved: the disk tier is not built yet)."""


class LogicError(Exception):
    """Misuse of the API or a broken internal rule."""


class InvalidStateError(LogicError):
    """A call made in a state that does not allow it (e.g. ``resize`` on a suspended cache)."""


class CorruptedError(Exception):
    """An internal invariant was found violated; the manager must not be used further."""


class BackendError(ImportError):
    """A backend is unknown or failed to load; the message lists the installed ones."""
