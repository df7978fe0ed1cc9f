"""The slot allocator's order (docs/manager.md, "Pools"): recycled slots first, oldest first, then
fresh ids counting up; a call gets all it asks for or nothing."""

from __future__ import annotations

import pytest

from kv_api.errors import OutOfPagesError
from kv_core_py.slot_allocator import SlotAllocator


def test_fresh_ids_count_up_from_zero() -> None:
    slots = SlotAllocator(8)
    assert slots.allocate(3) == [0, 1, 2]
    assert slots.allocate(2) == [3, 4]
    assert slots.num_free == 3


def test_recycled_slots_come_first_oldest_first() -> None:
    slots = SlotAllocator(8)
    slots.allocate(5)
    for slot in (3, 0, 4):
        slots.release(slot)
    assert slots.allocate(2) == [3, 0]
    assert slots.allocate(3) == [4, 5, 6]  # the last recycled one, then fresh ids


def test_allocation_is_all_or_nothing() -> None:
    slots = SlotAllocator(4)
    slots.allocate(3)
    slots.release(1)
    with pytest.raises(OutOfPagesError, match="need 3 slots, 2 free"):
        slots.allocate(3)
    assert slots.num_free == 2
    assert slots.allocate(2) == [1, 3]
