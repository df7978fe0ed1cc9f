"""How page bytes move between memory levels (docs/manager.md, "Eviction and tiers")."""

from __future__ import annotations

import abc
import ctypes
from collections.abc import Sequence

__all__ = ["CopyRun", "HostMemoryCopier", "PageCopier"]

#: ``(src_address, dst_address, num_bytes)``: one contiguous range of page bytes.
CopyRun = tuple[int, int, int]


class PageCopier(abc.ABC):
    """Copies page bytes between the memory levels of one manager: device <-> host, and device
    -> device for a copy on resume. An engine whose device level is accelerator memory plugs in
    its own (copies on its streams, complete when ``copy`` returns); disk I/O is the manager's.

    Raising aborts the move: the pages of the batch stay where they were, the error propagates
    to the caller of the manager's method."""

    @abc.abstractmethod
    def copy(self, src_level: int, dst_level: int, runs: Sequence[CopyRun]) -> None:
        """Copy each run; ``runs`` never overlap each other."""


class HostMemoryCopier(PageCopier):
    """Every level in host memory: ``memmove`` per run. The managers' default does the same
    without calling into Python."""

    def copy(self, src_level: int, dst_level: int, runs: Sequence[CopyRun]) -> None:
        for src, dst, n in runs:
            ctypes.memmove(dst, src, n)
