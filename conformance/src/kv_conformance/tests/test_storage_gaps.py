"""Tiered storage behaviour that mutation testing of the Python backend (docs/mutation.md) found
unchecked (docs/manager.md, "Eviction and tiers", "Reuse"): each test names the surviving
mutants of ``kv_core_py.storage`` it kills. Every backend must pass them."""

from __future__ import annotations

import os
from typing import Any

import pytest

import kv_api
from kv_api import LifeCycle, StorageStatistics

from ._manager import GRAIN, active, attention, check_accounting, committed, make_config, toks
from ._tiers import TPB, World, block_hashes, page_levels, pages_files, prefix, tier_config
from .test_manager_events import drain, setup
from .test_manager_siblings import summary


def window_first(ordinal: int, life_cycle: LifeCycle) -> int:
    """A priority callback: the window's pages are evicted before the full-attention ones."""
    return 10 if life_cycle.window is not None else 50


def test_adopting_a_sibling_without_a_page_in_its_first_life_cycle(backend: kv_api.Backend) -> None:
    """Layer group 0 is a window of 8 tokens, layer group 1 full attention, sharing one pool
    group of 16 slots. A writer commits [0..5] (block 0 and the partial block [4, 5]) with
    window pages of low priority; a cache of 7 blocks (14 pages, 12 free) evicts both window
    pages, which go alone, so the partial block keeps only its full-attention page. A cache
    committing [0..7] then replaces the partial block: the page of layer group 1 is adopted
    past the empty group 0 and, covering 2 tokens only, gives way to the new page (Removed for
    the partial block, its slot freed). Kills ``Storage.adopt__mutmut_3`` (``continue`` ->
    ``break``: the full-attention page stayed with the detached block, never freed)."""
    size = GRAIN // 16
    manager, events = setup(backend, make_config(TPB, layers=[attention(0, size, 8), attention(1, size)]))
    assert [(lc.id, lc.window) for lc in manager.life_cycles] == [(0, 8), (1, None)]
    drain(events)  # Created
    committed(manager, toks(6), callback=window_first)
    keys = block_hashes(toks(6))
    assert summary(drain(events)) == [
        ("stored", 0, [keys[0]]),
        ("stored", 1, [keys[0]]),
        ("stored", 0, [keys[1]]),
        ("stored", 1, [keys[1]]),
    ]
    pressure = active(manager, 7 * TPB)
    assert summary(drain(events)) == [("removed", 0, sorted(keys))]
    assert manager.get_storage_statistics() == [StorageStatistics(16, 0, 2)]
    pressure.close()

    committed(manager, toks(8))
    longer = block_hashes(toks(8))
    assert summary(drain(events)) == [
        ("stored", 0, [longer[0]]),
        ("removed", 1, [keys[1]]),
        ("stored", 0, [longer[1]]),
        ("stored", 1, [longer[1]]),
    ]
    # Two blocks with both pages, nothing else kept.
    assert manager.get_storage_statistics() == [StorageStatistics(16, 12, 4)]
    assert manager.probe_reuse(None, toks(8)) == 8
    manager.clear_reusable_blocks()
    assert summary(drain(events)) == [
        ("removed", 0, sorted(longer)),
        ("removed", 1, sorted(longer)),
    ]
    assert manager.get_storage_statistics() == [StorageStatistics(16, 16, 0)]
    check_accounting(manager, open_caches=False)


@pytest.mark.requires("host_tier")
def test_a_writer_takes_the_place_of_a_colder_tree_page_without_an_event_manager(backend: kv_api.Backend) -> None:
    """As in test_tiers' ``test_a_second_writer_takes_the_place_of_a_colder_tree_page``, with no
    event manager: the writer's device page replaces the host copy (freed), and a reader finds
    the block on the device. Kills ``Storage.replace__mutmut_8`` (``and`` -> ``or``: an
    ``Updated`` event sent to the missing event manager)."""
    m = backend.KVCacheManager(tier_config(["host"]), None)
    second = active(m, 2 * TPB)  # its own pages, no reuse
    committed(m, toks(2 * TPB))
    pressure = active(m, 6 * TPB)  # the device's 8 slots: the committed pages fall to the host
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 2, 2)]
    pressure.close()
    second.commit(toks(2 * TPB))
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 4, 0)]  # the cold copies are freed
    reader = m.create_kv_cache(None, toks(2 * TPB))
    assert reader.cached_tokens_by_level == [2 * TPB, 0]
    reader.close()
    second.close()
    assert m.get_storage_statistics(0) == [StorageStatistics(8, 6, 2)]


@pytest.mark.requires("host_tier")
def test_onboarded_pages_add_up_over_separate_moves(backend: kv_api.Backend) -> None:
    """Two prompts of two blocks fall to the host; two readers bring them back up one after the
    other: ``onboarded_pages`` counts all four, in the committed and the iteration stats. Kills
    ``Storage.move__mutmut_47`` (``+=`` -> ``=``: the second move's count replaced the first's)."""
    world = World(backend, tier_config(["host"]))
    m = world.manager
    for i in range(2):
        committed(m, prefix(i, 2))
    big = active(m, 8 * TPB)  # the device's 8 slots: all four committed pages fall to the host
    big.close()
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 0, 4)]
    m.get_and_reset_iteration_stats()
    for i in range(2):
        reader = m.create_kv_cache(None, prefix(i, 2))
        assert page_levels(reader) == [1, 1]
        assert reader.resume()
        assert page_levels(reader) == [0, 0]
        reader.close()
    assert m.get_storage_statistics(1) == [StorageStatistics(4, 4, 0)]
    assert m.get_and_reset_iteration_stats().onboarded_pages == 4
    assert world.committed_stats().onboarded_pages == 4


@pytest.mark.requires("disk_tier")
def test_a_full_disk_level_keeps_its_file_at_the_quota(backend: kv_api.Backend, tmp_path: Any) -> None:
    """Device (8 slots) and disk (8 slots): one-block prompts committed one after another fill
    the device, then the disk; from then on every eviction drops the disk's oldest page and the
    device's oldest falls into its slot. The disk blocks for arriving pages were allocated from
    the free slots only, so the pages file never grows past the quota (it grew by a slot when the
    pages beyond the free slots were given fresh slot ids past the end, where a full disk
    would have refused them with DiskOOMError)."""
    manager = kv_api.create_manager(tier_config(("disk",), tmp_path), backend=backend)
    try:
        (pages,) = pages_files(tmp_path)  # the file has no name: its descriptor's link
        quota = os.stat(pages).st_size
        for i in range(2 * 8 + 4):
            committed(manager, prefix(i))
            assert os.stat(pages).st_size == quota, i
        levels = [len(manager.create_kv_cache(None, prefix(i)).get_page_levels(0)) for i in range(20)]
        assert levels == [0] * 4 + [1] * 16  # the 4 oldest dropped, 8 on the disk, 8 on the device
    finally:
        manager.shutdown()
