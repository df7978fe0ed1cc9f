"""Slot ids as page indices show them (invariant 12): fresh ids 0, 1, 2, ... first, then freed
slots in the order they were freed; accounting ``free + evictable + in use == total``."""

from __future__ import annotations

from typing import Any

import kv_api
from kv_api import StorageStatistics

from ._manager import active, check_accounting, make_config, make_manager, toks

TPB = 4


def indices(cache: Any) -> list[int]:
    return list(cache.get_base_page_indices(0))


def test_fresh_ids_in_order(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    a = active(manager, 3 * TPB)
    assert indices(a) == [0, 1, 2]
    b = active(manager, 2 * TPB)
    assert indices(b) == [3, 4]
    assert a.resize(5 * TPB)
    assert indices(a) == [0, 1, 2, 5, 6]
    assert manager.get_storage_statistics() == [StorageStatistics(8, 1, 0)]
    check_accounting(manager)


def test_freed_slots_are_reused_first_in_fifo_order(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    a0, a1, a2 = (active(manager, TPB) for _ in range(3))
    assert [indices(c) for c in (a0, a1, a2)] == [[0], [1], [2]]
    # Uncommitted pages are freed at once when their cache closes.
    for c in (a1, a0, a2):
        c.close()
    assert manager.get_storage_statistics() == [StorageStatistics(8, 8, 0)]
    b = active(manager, 5 * TPB)
    assert indices(b) == [1, 0, 2, 3, 4]
    b.close()
    check_accounting(manager, open_caches=False)


def test_shrink_frees_slots(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    a = active(manager, 4 * TPB)
    assert indices(a) == [0, 1, 2, 3]
    assert a.resize(TPB)
    assert indices(a) == [0]
    assert manager.get_storage_statistics() == [StorageStatistics(8, 7, 0)]
    assert a.resize(2 * TPB)
    # The fresh ids 4.. are not handed out before a freed slot.
    assert indices(a)[1] in (1, 2, 3)
    check_accounting(manager)


def test_close_releases_the_last_block_first(backend: kv_api.Backend) -> None:
    """behaviour-spec §1 step 6: close drops pages last block first, so they recycle in that order."""
    manager = make_manager(backend, make_config(TPB, slots=8))
    a = active(manager, 3 * TPB)
    a.close()
    b = active(manager, 4 * TPB)
    assert indices(b) == [2, 1, 0, 3]


def test_committed_pages_are_evictable_not_free(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    a = active(manager, 3 * TPB, toks(2 * TPB))  # two committed blocks, one uncommitted
    assert manager.get_storage_statistics() == [StorageStatistics(8, 5, 0)]
    a.close()
    assert manager.get_storage_statistics() == [StorageStatistics(8, 6, 2)]
    # Free slots are used before anything is evicted: the freed slot 2, then fresh ids 3...
    b = active(manager, 6 * TPB)
    assert indices(b) == [2, 3, 4, 5, 6, 7]
    assert manager.get_storage_statistics() == [StorageStatistics(8, 0, 2)]
    assert manager.probe_reuse(None, toks(2 * TPB)) == 2 * TPB
    check_accounting(manager)
