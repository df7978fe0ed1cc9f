"""Page data (invariant 9): what a cache wrote into its pages is what a reusing cache reads, and a
reused partial block is copied into a private slot on the first resume, so the tree's page is
never written. Data goes through ``pool_memory``; a block's slot in layer group ``lg`` is
``get_base_page_indices(lg)[o]`` and spans ``slot_size`` bytes of every pool of its group."""

from __future__ import annotations

from typing import Any

import kv_api
from kv_api import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, KVCacheManagerConfig

from ._manager import GRAIN, active, check_indices, committed, fill_slot, life_cycles, make_manager, slot_bytes, toks

TPB = 4
#: Full attention and a window of 8, each with a key/value pool and a smaller scale pool; the
#: window layer's slots differ in size, so it has a pool group of its own.
LAYERS = [
    AttentionLayerConfig(0, [BufferConfig("key", 4096), BufferConfig("value", 4096), BufferConfig("scale", 256)]),
    AttentionLayerConfig(1, [BufferConfig("key", 2048), BufferConfig("value", 2048)], sliding_window_size=8),
]
CONFIG = KVCacheManagerConfig(TPB, [GpuCacheTierConfig(GRAIN)], LAYERS)


def write_all(manager: Any, cache: Any, seed: int) -> dict[tuple[int, int], bytes]:
    """A distinct pattern in every page the cache has locked: ``(layer group, block) -> bytes``."""
    written = {}
    for lc in life_cycles(manager):
        for o, slot in enumerate(cache.get_base_page_indices(lc.id)):
            if slot >= 0:
                written[lc.id, o] = fill_slot(manager, lc.id, slot, seed * 1000 + lc.id * 100 + o)
    return written


def test_reused_pages_carry_the_writers_data(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, CONFIG)
    writer = active(manager, 13)
    written = write_all(manager, writer, 1)
    assert {lg for lg, _ in written} == {0, 1}
    slots = {lg: list(writer.get_base_page_indices(lg)) for lg in (0, 1)}
    writer.commit(toks(12))
    writer.close()

    reader = manager.create_kv_cache(None, toks(12))
    assert reader.num_committed_tokens == 12
    assert reader.resume()
    check_indices(manager, reader)
    for lc in life_cycles(manager):
        for o, slot in enumerate(reader.get_base_page_indices(lc.id)):
            if slot < 0:
                continue
            assert slot == slots[lc.id][o], (lc.id, o)
            assert slot_bytes(manager, lc.id, slot) == written[lc.id, o], (lc.id, o)
    reader.close()


def test_reused_partial_block_is_copied_on_first_resume(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, CONFIG)
    writer = active(manager, 6)
    written = write_all(manager, writer, 2)
    tree_slots = {lg: list(writer.get_base_page_indices(lg)) for lg in (0, 1)}
    writer.commit(toks(6))
    writer.close()  # block 1 = [4, 5] enters the tree as a partial block

    reader = manager.create_kv_cache(None, toks(5))  # a prefix of the partial block
    assert reader.num_committed_tokens == 5
    assert reader.resume()
    copies = {}
    for lg in (0, 1):
        indices = list(reader.get_base_page_indices(lg))
        assert indices[0] == tree_slots[lg][0], lg  # the full block is shared
        private = indices[1]
        assert private >= 0 and private != tree_slots[lg][1], lg
        assert slot_bytes(manager, lg, private) == written[lg, 1], lg
        copies[lg] = private

    # Writing the private copy leaves the tree's page alone: a later reader sees the original.
    for lg, private in copies.items():
        assert fill_slot(manager, lg, private, 99) != written[lg, 1]
        assert slot_bytes(manager, lg, tree_slots[lg][1]) == written[lg, 1], lg
    again = manager.create_kv_cache(None, toks(6))
    assert again.num_committed_tokens == 6
    assert again.resume()
    for lg in (0, 1):
        slot = list(again.get_base_page_indices(lg))[1]
        assert slot not in (tree_slots[lg][1], copies[lg]), lg
        assert slot_bytes(manager, lg, slot) == written[lg, 1], lg
    # The copy is private to one cache: suspending and resuming keeps the same slot.
    reader.suspend()
    assert reader.resume()
    assert [list(reader.get_base_page_indices(lg))[1] for lg in (0, 1)] == [copies[0], copies[1]]
    again.close()
    reader.close()


def test_extending_a_reused_partial_block_replaces_it(backend: kv_api.Backend) -> None:
    """A reader that completes the partial block commits its own copy as the longer block,
    which replaces the partial one (docs/manager.md, "Reuse"): the partial block's pages are
    freed, and its prefix is reused from the longer block's page."""
    manager = make_manager(backend, CONFIG)
    writer = active(manager, 6)
    write_all(manager, writer, 3)
    writer.commit(toks(6))
    writer.close()
    assert [s.evictable for s in manager.get_storage_statistics()] == [2, 2]

    reader = active(manager, 8, reuse=toks(6))
    assert reader.num_committed_tokens == 6
    private = list(reader.get_base_page_indices(0))[1]
    data = fill_slot(manager, 0, private, 42)
    reader.commit([60, 61])
    reader.close()
    assert [s.evictable for s in manager.get_storage_statistics()] == [2, 2]  # blocks 0 and 1
    assert manager.probe_reuse(None, toks(6)) == 6
    assert manager.probe_reuse(None, [*toks(6), 60, 61]) == 8
    whole = manager.create_kv_cache(None, [*toks(6), 60, 61])
    assert whole.resume()
    assert list(whole.get_base_page_indices(0))[1] == private
    prefix = manager.create_kv_cache(None, toks(6))
    assert prefix.resume()
    copy = list(prefix.get_base_page_indices(0))[1]
    assert copy != private and slot_bytes(manager, 0, copy) == data
    prefix.close()
    whole.close()


def test_partial_match_ties_go_to_the_first_inserted_sibling(backend: kv_api.Backend) -> None:
    """Two siblings share the query's first two tokens of block 1: the one committed first is
    the one reused, so every backend copies the same data."""
    manager = make_manager(backend, CONFIG)
    committed(manager, toks(4))
    patterns: list[bytes] = []
    for tail in ([4, 5, 6, 7], [4, 5, 8, 9]):
        writer = active(manager, 8, reuse=toks(4))
        slot = list(writer.get_base_page_indices(0))[1]
        patterns.append(fill_slot(manager, 0, slot, len(patterns) + 7))
        writer.commit(tail)
        writer.close()
    reader = manager.create_kv_cache(None, [*toks(6), 10])
    assert reader.num_committed_tokens == 6
    assert reader.resume()
    private = list(reader.get_base_page_indices(0))[1]
    assert slot_bytes(manager, 0, private) == patterns[0]
    reader.close()
