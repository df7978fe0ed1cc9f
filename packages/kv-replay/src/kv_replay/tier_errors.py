"""A manager's failures on one of its cache levels, as a ``TierError`` naming the level's config
and the field at fault (``quota`` or ``path``), for the replay to name the option behind it.

Neither error says which level failed: a ``HostOOMError`` (memory it cannot map) does not
name its level, and a disk tier's ``OSError`` does not say whether its directory or its files'
size failed. Both are told here by trying the one thing again, alone: reserving the address
space of the quotas (nothing committed, released at once) and creating a file in the directory.
"""

from __future__ import annotations

import mmap
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kv_api import CacheTierConfig, DiskCacheTierConfig, HostCacheTierConfig, KVCacheManagerConfig
from kv_api.errors import DiskOOMError, HostOOMError

__all__ = ["TierError", "tier_errors", "unmapped"]

#: Reserved, not committed, as the backends map pools. The mmap module has the name from
#: Python 3.13 only; 0x4000 is Linux's (x86-64, arm64).
_RESERVE: int = mmap.MAP_PRIVATE | getattr(mmap, "MAP_NORESERVE", 0x4000)


class TierError(Exception):
    """The manager failed on the cache level ``tier``: on its ``field`` (``"quota"``, or
    ``"path"``, a disk tier's directory), with the backend's ``error``."""

    def __init__(self, tier: CacheTierConfig, field: str, error: Exception) -> None:
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
        raise TierError(unmapped(config.cache_tiers), "quota", exc) from None
    except (DiskOOMError, OSError) as exc:
        disk = next((t for t in config.cache_tiers if isinstance(t, DiskCacheTierConfig)), None)
        if disk is None or isinstance(exc, BrokenPipeError):
            raise
        sized = isinstance(exc, DiskOOMError) or _creates_files(disk.path)
        raise TierError(disk, "quota" if sized else "path", exc) from None


def unmapped(tiers: Sequence[CacheTierConfig]) -> CacheTierConfig:
    """The level memory could not be mapped for. The backends map the device level, then the
    host level, each about its quota: the host level when the address space holds the device
    quota but not the host quota beside it, else the device level (its quota, or its minimum
    slots, which its layers set and which can exceed the quota)."""
    device = tiers[0]
    host = next((t for t in tiers if isinstance(t, HostCacheTierConfig)), None)
    if host is not None and _reservable(device.quota) and not _reservable(device.quota, host.quota):
        return host
    return device


def _reservable(*sizes: int) -> bool:
    """Whether the address space holds mappings of ``sizes`` bytes at once."""
    maps: list[mmap.mmap] = []
    try:
        for size in sizes:
            maps.append(mmap.mmap(-1, size, flags=_RESERVE))
        return True
    except (OSError, OverflowError):  # OverflowError: a length beyond ssize_t
        return False
    finally:
        for m in maps:
            m.close()


def _creates_files(directory: str) -> bool:
    """Whether a file can be created in ``directory``, the disk tier's first step: if so, what
    failed was the files' size (or their I/O), not the directory."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False
