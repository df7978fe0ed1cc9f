"""Real memory behind a pool: reserved address space, committed page by page as it is written."""

from __future__ import annotations

import ctypes
import mmap

from kv_api.errors import HostOOMError

# Private and no-reserve, as the native backend maps: the whole quota is address space with no
# commit charge (a shared anonymous map is shmem, charged whole), and a page costs memory once
# written. The mmap module lacks the name before Python 3.13; 0x4000 is Linux's (x86-64, arm64).
_FLAGS = mmap.MAP_PRIVATE | getattr(mmap, "MAP_NORESERVE", 0x4000)


class MemoryPool:
    def __init__(self, num_slots: int, slot_size: int) -> None:
        self.slot_size = slot_size
        self.size = num_slots * slot_size
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
