"""Real memory behind a pool: anonymous mmap, so untouched slots cost no RAM."""

from __future__ import annotations

import ctypes
import mmap


class MemoryPool:
    def __init__(self, num_slots: int, slot_size: int) -> None:
        self.slot_size = slot_size
        self.size = num_slots * slot_size
        self._map = mmap.mmap(-1, max(self.size, 1))
        view = ctypes.c_char.from_buffer(self._map)
        self.base_address = ctypes.addressof(view)
        del view  # release the export so the map can be closed

    def view(self) -> memoryview:
        """Writable bytes of the whole pool; slot ``s`` is ``[s * slot_size, (s + 1) * slot_size)``."""
        return memoryview(self._map)[: self.size]

    def copy_slot(self, src: int, dst: int) -> None:
        s = self.slot_size
        self._map[dst * s : (dst + 1) * s] = self._map[src * s : (src + 1) * s]
