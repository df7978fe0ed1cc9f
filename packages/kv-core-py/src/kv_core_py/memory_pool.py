"""Real memory behind a pool: reserved address space, committed as the pool group's slots are
first handed out (``populate``) rather than page by page as the engine or a copy first writes
them."""

from __future__ import annotations

import ctypes
import mmap

from kv_api.errors import HostOOMError

# Private and no-reserve, as the native backend maps: the whole quota is address space with no
# commit charge (a shared anonymous map is shmem, charged whole), and a page costs memory once
# written. The mmap module lacks the name before Python 3.13; 0x4000 is Linux's (x86-64, arm64).
_FLAGS = mmap.MAP_PRIVATE | getattr(mmap, "MAP_NORESERVE", 0x4000)
# Linux 5.14's; the mmap module names it from Python 3.13 only.
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
# A huge page's size: a populate call covers whole ones, so small slots cost a call per 2 MiB.
POPULATE_CHUNK = 2 << 20


class MemoryPool:
    def __init__(self, num_slots: int, slot_size: int) -> None:
        self.slot_size = slot_size
        self.size = num_slots * slot_size
        self.populated = 0  # bytes below are committed
        mapped = max(self.size, 1)
        try:
            self._map = mmap.mmap(-1, mapped, flags=_FLAGS)
        except (OSError, OverflowError) as e:  # OverflowError: a length beyond ssize_t
            raise HostOOMError(f"cannot map {mapped} bytes for a pool") from e
        view = ctypes.c_char.from_buffer(self._map)
        self.base_address = ctypes.addressof(view)
        del view  # release the export so the map can be closed

    def view(self) -> memoryview:
        """Writable bytes of the whole pool; slot ``s`` is ``[s * slot_size, (s + 1) * slot_size)``."""
        return memoryview(self._map)[: self.size]

    def populate(self, end: int) -> None:
        """Commit the bytes below ``end`` (rounded up to ``POPULATE_CHUNK``) not committed yet,
        in one call (``MADV_POPULATE_WRITE``, which leaves every byte's value as it is), so the
        copies and writes into them run at memory speed rather than taking a fault per page.
        Advisory: where the kernel lacks it (before Linux 5.14) or refuses, the bytes fault in
        as they are written."""
        end = min(self.size, -(-end // POPULATE_CHUNK) * POPULATE_CHUNK)
        if end <= self.populated:
            return
        try:  # asked once, whatever the answer: a refused range faults in as it is written
            self._map.madvise(_POPULATE_WRITE, self.populated, end - self.populated)
        except OSError:
            pass
        self.populated = end
