"""A manager's failures on one of its cache levels, as a ``TierError`` naming the level's config
and the field at fault (``quota`` or ``path``), for the replay to name the option behind it.

The backends say which level failed (the error's ``level``, docs/errors.md, "Which level"); a
disk level's ``OSError`` does not say whether its directory or its files' size failed, which is
told by creating a file in the directory.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kv_api import DiskCacheTierConfig, GpuCacheTierConfig, HostCacheTierConfig, KVCacheManagerConfig
from kv_api.errors import DiskOOMError, HostOOMError

__all__ = ["TierError", "tier_errors"]

#: A level of this process (a remote tier's store fails as misses, never as an error).
LocalTier = GpuCacheTierConfig | HostCacheTierConfig | DiskCacheTierConfig


class TierError(Exception):
    """The manager failed on the cache level ``tier``: on its ``field`` (``"quota"``, or
    ``"path"``, a disk tier's directory), with the backend's ``error``."""

    def __init__(self, tier: LocalTier, field: str, error: Exception) -> None:
        super().__init__(f"{type(tier).__name__}.{field}: {error}")
        self.tier = tier
        self.field = field
        self.error = error


@contextmanager
def tier_errors(config: KVCacheManagerConfig) -> Iterator[None]:
    """A manager of ``config`` built or used inside: memory it cannot map (``HostOOMError``), a
    full disk tier (``DiskOOMError``) and the disk tier's failing files (``OSError``; a closed
    pipe is not theirs) come out as a ``TierError``."""
    try:
        yield
    except HostOOMError as exc:
        raise TierError(_failed_level(config.local_tiers, exc), "quota", exc) from None
    except (DiskOOMError, OSError) as exc:
        disk = next((t for t in config.cache_tiers if isinstance(t, DiskCacheTierConfig)), None)
        if disk is None or isinstance(exc, BrokenPipeError):
            raise
        sized = isinstance(exc, DiskOOMError) or _creates_files(disk.path)
        raise TierError(disk, "quota" if sized else "path", exc) from None


def _failed_level(tiers: Sequence[LocalTier], exc: Exception) -> LocalTier:
    """The level ``exc`` says failed (its ``level``), else the device level: memory no level
    asked for (a request's block table) is the device quota's to blame."""
    level = getattr(exc, "level", None)
    return tiers[level] if isinstance(level, int) and 0 <= level < len(tiers) else tiers[0]


def _creates_files(directory: str) -> bool:
    """Whether a file can be created in ``directory``, the disk tier's first step: if so, what
    failed was the files' size (or their I/O), not the directory."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False
