"""Sliding-window scratch reuse (behaviour-spec §2, §3 "SWA scratch reuse", "Min slots";
docs/manager.md, "Sliding-window scratch"): a step's blocks that are out of the window once the
step is done get no page of their own (base index -1) but share ``ceil(n * slot_util_frac_max)``
scratch slots, allocated with the cache's pages, freed on suspend and when no longer needed; the
range at its edges (no scratch while the rewind reaches back to block 0; ``slot_util_frac_max`` of
a one-byte layer, of a buffer stored at a finer granularity and of window layers after an SSM
layer); the resize rule ``old_cap - max_rewind_len <= history <= old_cap``, commits inside the
scratch range and the refusals (of the capacity setter, of bringing scratch blocks back); index
modes and the base address; min-slot sizing.
"""

from __future__ import annotations

from typing import Any

import pytest

import kv_api
from kv_api import (
    BAD_PAGE_INDEX,
    AttentionLayerConfig,
    BatchDesc,
    BufferConfig,
    GpuCacheTierConfig,
    KVCacheDesc,
    KVCacheManagerConfig,
    PageIndexMode,
    ScratchDesc,
    SsmLayerConfig,
    SwaScratchReuseConfig,
)
from kv_api.constants import ceil_div

from ._manager import GRAIN, MIB, check_accounting, fails_atomically, kv, raises_exactly, toks

# Every test here configures scratch reuse.
pytestmark = pytest.mark.requires("swa_scratch")

FULL, WINDOW = 0, 1  # layer groups
TPB, W = 4, 8
SLOT = GRAIN // 32  # each life cycle's slot: one pool group of 32 slots per grain


def config(
    rewind: int | None = 0, window_layers: int = 2, sinks: int | None = None, quota: int = 2 * GRAIN, **kwargs: Any
) -> KVCacheManagerConfig:
    """Full attention (layer group 0) and ``window_layers`` window layers (layer group 1) whose
    slots are both ``SLOT`` bytes, so slot_util_frac_max is ``1 / window_layers``; 64 slots."""
    layer = SLOT // window_layers // 2
    layers = [AttentionLayerConfig(0, [BufferConfig("key", SLOT // 2), BufferConfig("value", SLOT // 2)])]
    layers += [
        AttentionLayerConfig(1 + i, [BufferConfig("key", layer), BufferConfig("value", layer)], W, sinks)
        for i in range(window_layers)
    ]
    scratch = None if rewind is None else SwaScratchReuseConfig(rewind)
    return KVCacheManagerConfig(TPB, [GpuCacheTierConfig(quota)], layers, swa_scratch_reuse=scratch, **kwargs)


def in_use(manager: kv_api.KVCacheManager) -> int:
    return sum(s.total - s.free - s.evictable for s in manager.get_storage_statistics())


def stepped(manager: kv_api.KVCacheManager, capacity: int, history: int = 0) -> kv_api.KVCache:
    """An active cache at ``history`` committed tokens (one step of that size first), then
    grown to ``capacity``."""
    cache = manager.create_kv_cache(None, [])
    assert cache.resume()
    if history:
        assert cache.resize(history, 0)
        cache.commit(toks(history))
    assert cache.resize(capacity, history)
    return cache


# (window layers, sinks, max_rewind_len, capacity, history) -> the scratch range, its slots
EXAMPLES = [
    (2, None, 0, 40, 0, range(0, 8), 4),  # stale(40) = [0, 33 // 4): 8 blocks, half a slot each
    (2, None, 0, 41, 0, range(0, 8), 4),
    (2, None, 0, 13, 0, range(0, 1), 1),  # stale(13) = [0, 6 // 4)
    (2, None, 4, 40, 0, range(0, 7), 4),  # stale(36) = [0, 29 // 4): a rewind of 4 keeps block 7
    (2, None, 0, 40, 20, range(5, 8), 2),  # [ceil(20 / 4), ...): the history's blocks are not new
    (3, None, 0, 40, 0, range(0, 8), 3),  # a third of a slot each: ceil(8 / 3)
    (1, None, 0, 40, 0, range(0, 8), 8),  # one layer fills the slot: no saving
    (2, 4, 0, 40, 0, range(1, 8), 4),  # one sink block, never stale: ceil(7 / 2)
]


@pytest.mark.parametrize(("layers", "sinks", "rewind", "cap", "hist", "expected", "slots"), EXAMPLES)
def test_scratch_range_and_slots(
    backend: kv_api.Backend,
    layers: int,
    sinks: int | None,
    rewind: int,
    cap: int,
    hist: int,
    expected: range,
    slots: int,
) -> None:
    manager = backend.KVCacheManager(config(rewind, layers, sinks), None)
    cache = stepped(manager, cap, hist)
    desc = cache.get_scratch_desc(WINDOW)
    assert isinstance(desc, ScratchDesc)
    assert desc.range == expected and len(desc.slot_ids) == slots
    assert len(set(desc.slot_ids)) == slots and cache.has_scratch_slots
    assert cache.get_scratch_desc(FULL) is None  # full attention is never stale
    window = cache.get_base_page_indices(WINDOW)
    full = cache.get_base_page_indices(FULL)
    for o in expected:
        assert window[o] == BAD_PAGE_INDEX
    # Every other window block above the history has a page; no slot is used twice.
    for o in range(ceil_div(hist, TPB), cache.num_blocks):
        if o not in expected:
            assert window[o] != BAD_PAGE_INDEX
    # (Three window layers make a slot of another size: two pool groups, each with its own ids.)
    used = [i for i in window if i != BAD_PAGE_INDEX] + list(desc.slot_ids)
    assert len(used) == len(set(used))
    assert BAD_PAGE_INDEX not in list(full)
    # Exactly the locked pages and the scratch slots are in use (stale pages committed: evictable).
    assert in_use(manager) == len(used) + len(full)
    check_accounting(manager)


def scratch_of(manager: kv_api.KVCacheManager, layer_group: int, capacity: int, history: int = 0) -> ScratchDesc | None:
    """A fresh cache stepped to ``capacity`` from ``history`` committed tokens: its scratch."""
    return stepped(manager, capacity, history).get_scratch_desc(layer_group)


def one_token_window(rewind: int) -> KVCacheManagerConfig:
    """tpb 1, full attention (layer group 0) and two window-1 layers (layer group 1): at history
    ``H`` the window's blocks below ``H`` are stale."""
    layers = [AttentionLayerConfig(0, kv(1024))] + [AttentionLayerConfig(i, kv(512), 1) for i in (1, 2)]
    return KVCacheManagerConfig(1, [GpuCacheTierConfig(GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig(rewind))


def test_no_scratch_while_the_rewind_reaches_back_to_zero(backend: kv_api.Backend) -> None:
    """``stale(max(0, cap - max_rewind_len))``: with max_rewind_len 4, a capacity of 1 or 4
    leaves stale(0), empty: no scratch. At 5 it is stale(1) = block 0, which goes scratch."""
    m = backend.KVCacheManager(one_token_window(4))
    assert scratch_of(m, 1, 1) is None
    assert scratch_of(m, 1, 4) is None
    desc = scratch_of(m, 1, 5)
    assert desc is not None and desc.range == range(0, 1) and len(desc.slot_ids) == 1


def test_a_one_byte_layer_takes_its_whole_slot(backend: kv_api.Backend) -> None:
    """A window layer of one 1-byte buffer, alone in its pool group (1-byte slots): its share
    of the slot is 1, so 8 scratch blocks take 8 slots."""
    layers = [AttentionLayerConfig(0, kv(1024)), AttentionLayerConfig(1, [BufferConfig("key", 1)], 8)]
    m = backend.KVCacheManager(
        KVCacheManagerConfig(4, [GpuCacheTierConfig(GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig(0))
    )
    desc = scratch_of(m, 1, 40)
    assert desc is not None and desc.range == range(0, 8) and len(desc.slot_ids) == 8


def test_a_finer_buffer_counts_its_expanded_bytes(backend: kv_api.Backend) -> None:
    """Buffers of 1024 bytes stored at 2 tokens a page (tpb 4): a block is 2 pages, 4096 bytes
    of the layer, the whole slot: no saving, 8 scratch blocks take 8 slots."""
    layers = [AttentionLayerConfig(0, kv(1024, 2), 8)]
    m = backend.KVCacheManager(
        KVCacheManagerConfig(4, [GpuCacheTierConfig(GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig(0))
    )
    desc = scratch_of(m, 0, 40)
    assert desc is not None and desc.range == range(0, 8) and len(desc.slot_ids) == 8


@pytest.mark.requires("ssm_layers")
def test_window_layers_after_an_ssm_layer(backend: kv_api.Backend) -> None:
    """An SSM layer listed first does not hide the window layers after it: two of 512 bytes in
    1024-byte slots take half a slot each, 8 scratch blocks 4 slots."""
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [
        SsmLayerConfig(0, [BufferConfig("state", 4096)]),
        AttentionLayerConfig(1, kv(1024)),
        AttentionLayerConfig(2, kv(256), 8),
        AttentionLayerConfig(3, kv(256), 8),
    ]
    config = KVCacheManagerConfig(
        4, [GpuCacheTierConfig(4 * GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig(0), commit_min_snapshot=True
    )
    m = backend.KVCacheManager(config)
    desc = scratch_of(m, 2, 40)
    assert desc is not None and desc.range == range(0, 8) and len(desc.slot_ids) == 4


def test_scratch_freed_on_suspend_and_when_the_range_empties(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(config(), None)
    cache = stepped(manager, 40)
    desc = cache.get_scratch_desc(WINDOW)
    assert desc is not None and in_use(manager) == 10 + 2 + 4
    cache.suspend()
    assert not cache.has_scratch_slots and cache.get_scratch_desc(WINDOW) is None
    assert in_use(manager) == 10 + 2  # held pages stay; the scratch slots are free
    assert cache.resume()
    again = cache.get_scratch_desc(WINDOW)
    assert again is not None and again.range == desc.range and len(again.slot_ids) == 4
    # The step's tokens committed: the history reaches the capacity, nothing is scratch any more.
    cache.commit(toks(40))
    assert cache.get_scratch_desc(WINDOW) is None and not cache.has_scratch_slots
    assert list(cache.get_base_page_indices(WINDOW))[:8] == [BAD_PAGE_INDEX] * 8
    # The scratch blocks were never committed for the window: a reuse of 40 tokens finds no
    # window page there, so the match is cut to what the window can serve.
    (s,) = manager.get_storage_statistics()
    assert s.total - s.free == 10 + 2  # no window page of blocks 0..7 anywhere, in use or evictable
    cache.close()
    check_accounting(manager, open_caches=False)


def test_commit_frees_the_scratch(backend: kv_api.Backend) -> None:
    """A commit reaching capacity - max_rewind_len leaves every scratch block stale: the slots go."""
    manager = backend.KVCacheManager(config(4), None)
    cache = stepped(manager, 40)
    desc = cache.get_scratch_desc(WINDOW)
    assert desc is not None and desc.range == range(0, 7) and len(desc.slot_ids) == 4
    cache.commit(toks(36))  # history 36 >= capacity - max_rewind_len: scratch [9, 7) is empty
    assert cache.get_scratch_desc(WINDOW) is None
    cache.close()
    manager2 = backend.KVCacheManager(config(16), None)
    c2 = stepped(manager2, 80)
    d2 = c2.get_scratch_desc(WINDOW)
    assert d2 is not None and d2.range == range(0, 14) and len(d2.slot_ids) == 7  # stale(64) = [0, 57 // 4)
    # Below capacity - max_rewind_len = 64 the history would need blocks 12 and 13 back.
    fails_atomically(manager2, [c2], lambda: c2.commit(toks(60)), ValueError)
    c2.commit(toks(64))  # stale(64) = [0, 14): every scratch block is out of the window
    assert c2.get_scratch_desc(WINDOW) is None and not c2.has_scratch_slots
    check_accounting(manager2)


def test_a_commit_inside_the_scratch_range_is_allowed(backend: kv_api.Backend) -> None:
    """tpb 4, window 2: at history 1 and capacity 20 the scratch range is [1, 4) (stale(20) ends
    at 19 // 4). Committing 3 more tokens (history 4) keeps it [1, 4): no scratch block leaves
    the range, so nothing needs to be stale and the commit goes through, the scratch unchanged."""
    layers = [AttentionLayerConfig(0, kv(1024))] + [AttentionLayerConfig(i, kv(512), 2) for i in (1, 2)]
    m = backend.KVCacheManager(
        KVCacheManagerConfig(4, [GpuCacheTierConfig(GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig(0))
    )
    cache = m.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(1, 0)
    cache.commit(toks(1))
    assert cache.resize(20, 1)
    before = cache.get_scratch_desc(1)
    assert before is not None and before.range == range(1, 4)
    pages = list(cache.get_base_page_indices(1))
    cache.commit(toks(3, 1))
    assert cache.history_length == 4
    assert cache.get_scratch_desc(1) == before
    assert list(cache.get_base_page_indices(1)) == pages
    cache.commit(toks(16, 4))  # history 20: every scratch block stale, the slots go
    assert cache.get_scratch_desc(1) is None and not cache.has_scratch_slots


def test_bringing_back_scratch_blocks_is_refused_with_its_message(backend: kv_api.Backend) -> None:
    """Window 8, tpb 4, max_rewind_len 4, capacity 40: scratch [0, 7). A history of 20 would
    need blocks 3..6 inside the window again."""
    layers = [AttentionLayerConfig(0, kv(1024))] + [AttentionLayerConfig(i, kv(512), 8) for i in (1, 2)]
    m = backend.KVCacheManager(
        KVCacheManagerConfig(4, [GpuCacheTierConfig(2 * GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig(4))
    )
    cache = m.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(40, 0)
    rule = (
        "history_length 20 would bring back scratch blocks of layer group 1 (their data is gone); "
        "keep it at least capacity - max_rewind_len"
    )
    assert str(raises_exactly(ValueError, lambda: cache.commit(toks(20)))) == f"commit: {rule}"
    assert str(raises_exactly(ValueError, lambda: cache.resize(40, 20))) == f"resize: {rule}"
    fails_atomically(m, [cache], lambda: cache.commit(toks(20)), ValueError)


def test_rewind_within_the_rule(backend: kv_api.Backend) -> None:
    """A step of drafts, some rejected: the next resize starts from a history below the old
    capacity, by up to max_rewind_len; the rewound blocks' pages go scratch where due."""
    manager = backend.KVCacheManager(config(8), None)
    cache = stepped(manager, 40)
    before = cache.get_base_page_indices(WINDOW)
    assert before[6] != BAD_PAGE_INDEX and before[9] != BAD_PAGE_INDEX  # scratch was stale(32) = [0, 6)
    assert cache.resize(56, 32)  # 40 - 8 <= 32 <= 40
    desc = cache.get_scratch_desc(WINDOW)
    assert desc is not None and desc.range == range(8, 10) and len(desc.slot_ids) == 1  # stale(48) = [0, 41 // 4)
    after = cache.get_base_page_indices(WINDOW)
    assert after[8] == after[9] == BAD_PAGE_INDEX  # the rewound blocks' pages went
    assert list(after[6:8]) == list(before[6:8])
    check_accounting(manager)


def test_resize_rule_and_capacity_setter(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(config(4), None)
    cache = stepped(manager, 40)
    for hist in (35, 41):
        err = raises_exactly(ValueError, lambda h=hist: cache.resize(48, h))  # type: ignore[misc]
        assert "history_length in [36, 40]" in str(err)
        fails_atomically(manager, [cache], lambda h=hist: cache.resize(48, h), ValueError)  # type: ignore[misc]

    def set_capacity() -> None:
        cache.capacity = 44

    fails_atomically(manager, [cache], set_capacity, ValueError)
    # A commit that would bring back scratch blocks inside the window (history below
    # capacity - max_rewind_len) is refused before anything changes.
    fails_atomically(manager, [cache], lambda: cache.commit(toks(20)), ValueError)
    assert cache.num_committed_tokens == 0
    assert cache.resize(40, 36) and cache.get_scratch_desc(WINDOW) is None  # capacity unchanged: no rule
    # Without scratch reuse the same calls are fine.
    plain = backend.KVCacheManager(config(None), None)
    other = stepped(plain, 40)
    other.capacity = 44
    assert other.resize(48, 20)


def scratch_config(rewind: int) -> KVCacheManagerConfig:
    """Full attention and two window layers (window 8) sharing one pool group of 64 slots, with
    SWA scratch reuse allowing a rewind of ``rewind`` tokens."""
    slot = GRAIN // 32
    layers = [AttentionLayerConfig(0, [BufferConfig("key", slot // 2), BufferConfig("value", slot // 2)])]
    layers += [
        AttentionLayerConfig(1 + i, [BufferConfig("key", slot // 4), BufferConfig("value", slot // 4)], 8)
        for i in range(2)
    ]
    return KVCacheManagerConfig(
        TPB, [GpuCacheTierConfig(2 * GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig(rewind)
    )


@pytest.mark.requires("swa_scratch")
def test_capacity_setter_is_refused_with_scratch_reuse_even_where_resize_would_do(backend: kv_api.Backend) -> None:
    """``cache.capacity = n`` with scratch reuse on is a ValueError naming the rule, even where
    ``resize(n, history)`` is allowed; ``cache.history_length = n`` is not affected."""
    manager = backend.KVCacheManager(scratch_config(4), None)
    cache = manager.create_kv_cache(None, [])
    assert cache.resume()
    assert cache.enable_swa_scratch_reuse
    assert cache.resize(36, 0)
    cache.commit(toks(36))
    assert cache.resize(40, 36)
    cache.history_length = 38  # the history alone: fine
    assert (cache.history_length, cache.capacity) == (38, 40)

    def set_capacity() -> None:
        cache.capacity = 44

    err = raises_exactly(ValueError, set_capacity)
    assert str(err) == "capacity: cannot be set alone with SWA scratch reuse enabled (use resize)"
    assert (cache.history_length, cache.capacity) == (38, 40)
    assert cache.resize(44, 38)  # what the setter refused, spelled out
    assert (cache.history_length, cache.capacity) == (38, 44)
    cache.close()


def test_two_windows_drop_their_pages_entering_scratch_in_one_resize(backends: list[kv_api.Backend]) -> None:
    """Windows of 8 and 12 tokens (two life cycles, layer groups 1 and 2), rewind 64. At
    capacity 16 and history 0 nothing is stale at max(0, 16 - 64) = 0, so blocks 0-3 have pages
    in both windows. Resized to 100 from the same history, the scratch ranges are the blocks
    stale at 36 from block 0: 0-6 for the window of 8, 0-5 for the window of 12; blocks 0-3 of
    both give their pages up in that one resize (every life cycle's, not only the last
    one's) and read BAD_PAGE_INDEX. Every backend ends alike."""
    kv_layer = [BufferConfig("key", GRAIN // 64), BufferConfig("value", GRAIN // 64)]
    layers = [
        AttentionLayerConfig(0, kv_layer),
        AttentionLayerConfig(1, kv_layer, 8),
        AttentionLayerConfig(2, kv_layer, 12),
    ]
    config = KVCacheManagerConfig(
        4, [GpuCacheTierConfig(4 * GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig(64)
    )
    seen = []
    for backend in backends:
        manager = backend.KVCacheManager(config)
        cache = manager.create_kv_cache(None, [])
        assert cache.resume() and cache.resize(16, 0)
        assert all(i >= 0 for g in (1, 2) for i in cache.get_base_page_indices(g))
        free_before = [s.free for s in manager.get_storage_statistics()]
        assert cache.resize(100, 0)
        pages = [list(cache.get_base_page_indices(g)) for g in range(3)]
        assert pages[1][:4] == [-1] * 4 and pages[2][:4] == [-1] * 4, pages
        seen.append((free_before, manager.get_storage_statistics(), pages))
        cache.close()
    assert all(s == seen[0] for s in seen[1:])


def test_setter(backend: kv_api.Backend) -> None:
    plain = backend.KVCacheManager(config(None), None)
    cache = plain.create_kv_cache(None, [])
    assert cache.enable_swa_scratch_reuse is False
    cache.enable_swa_scratch_reuse = False  # unchanged: fine
    err = raises_exactly(ValueError, lambda: setattr(cache, "enable_swa_scratch_reuse", True))
    assert str(err) == "enable_swa_scratch_reuse: the manager's config has no swa_scratch_reuse"
    raises_exactly(TypeError, lambda: setattr(cache, "enable_swa_scratch_reuse", 1))

    manager = backend.KVCacheManager(config(), None)
    c = stepped(manager, 40)
    assert c.enable_swa_scratch_reuse is True
    err = raises_exactly(ValueError, lambda: setattr(c, "enable_swa_scratch_reuse", False))
    assert "scratch blocks are needed" in str(err)
    c.commit(toks(40))
    c.enable_swa_scratch_reuse = False  # nothing scratch now
    assert c.resize(80, 40) and c.get_scratch_desc(WINDOW) is None and not c.has_scratch_slots
    assert BAD_PAGE_INDEX not in list(c.get_base_page_indices(WINDOW))[10:]
    c.capacity = 84  # allowed again
    raises_exactly(ValueError, lambda: setattr(c, "enable_swa_scratch_reuse", True))  # blocks would go scratch
    assert c.enable_swa_scratch_reuse is False


def test_index_modes(backend: kv_api.Backend) -> None:
    manager = backend.KVCacheManager(config(), None)
    cache = stepped(manager, 40)
    assert cache.supports_index_mode(PageIndexMode.PER_LAYER)
    assert not cache.supports_index_mode(PageIndexMode.SHARED)  # scratch slots are per layer
    cache.suspend()
    assert cache.supports_index_mode(PageIndexMode.SHARED)
    raises_exactly(ValueError, lambda: cache.supports_index_mode(7))  # type: ignore[arg-type]
    err = raises_exactly(ValueError, lambda: manager.get_mem_pool_base_address(1, "key"))
    assert "index_mode is required" in str(err)
    per_layer = manager.get_mem_pool_base_address(1, "value", PageIndexMode.PER_LAYER)
    assert manager.get_mem_pool_base_address(1, "value", PageIndexMode.SHARED) == per_layer + SLOT // 4
    plain = backend.KVCacheManager(config(None), None)
    assert plain.get_mem_pool_base_address(1, "value") == plain.get_mem_pool_base_address(
        1, "value", PageIndexMode.PER_LAYER
    )
    assert manager.get_page_index_converter(1, "key").scratch_pages_per_block == 1


@pytest.mark.requires("swa_scratch")
def test_base_address_needs_an_index_mode_with_scratch_reuse(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(scratch_config(0), None)
    err = raises_exactly(ValueError, lambda: m.get_mem_pool_base_address(0, "key"))
    assert str(err) == "get_mem_pool_base_address: index_mode is required with swa_scratch_reuse"
    assert m.get_mem_pool_base_address(0, "key", kv_api.PageIndexMode.PER_LAYER) > 0


def test_converter_scratch_pages_per_block(backend: kv_api.Backend) -> None:
    """A buffer stored at a finer granularity (override 2 of tokens_per_block 4): a block, and
    so a scratch block, is two of its pages."""
    layers = [
        AttentionLayerConfig(0, [BufferConfig("key", 1024, 2), BufferConfig("value", 1024, 2)], W),
    ]
    manager = backend.KVCacheManager(
        KVCacheManagerConfig(TPB, [GpuCacheTierConfig(GRAIN)], layers, swa_scratch_reuse=SwaScratchReuseConfig()),
        None,
    )
    conv = manager.get_page_index_converter(0, "value")
    assert (conv.expansion, conv.scratch_pages_per_block) == (2, 2)
    assert conv([BAD_PAGE_INDEX, 3]) == [BAD_PAGE_INDEX, BAD_PAGE_INDEX, 14, 15]


def test_min_slots_with_scratch(backend: kv_api.Backend) -> None:
    """One request of 40 new tokens: without scratch 10 + 10 blocks, with it the window's 8
    scratch blocks cost ceil(8 / 2) = 4 slots: 10 + 6; each over max_util_for_resume 0.97."""

    def slots(rewind: int | None) -> int:
        big = KVCacheManagerConfig(
            TPB,
            [GpuCacheTierConfig(GRAIN)],
            [
                AttentionLayerConfig(0, [BufferConfig("key", MIB), BufferConfig("value", MIB)]),
                AttentionLayerConfig(1, [BufferConfig("key", MIB // 2), BufferConfig("value", MIB // 2)], W),
                AttentionLayerConfig(2, [BufferConfig("key", MIB // 2), BufferConfig("value", MIB // 2)], W),
            ],
            constraints=[BatchDesc([KVCacheDesc(40, 0)])],
            swa_scratch_reuse=None if rewind is None else SwaScratchReuseConfig(rewind),
        )
        m = backend.KVCacheManager(big, None)
        (pg,) = m.pool_group_descs
        assert m.get_quota() == pg.num_slots * GRAIN  # the quota is the minimum (a slot is a grain)
        return pg.num_slots

    assert slots(None) == 11 + 11
    assert slots(0) == 11 + ceil_div(6 * 100, 97)  # ceil(6 / 0.97) = 7
    assert slots(4) == 11 + ceil_div(7 * 100, 97)  # stale(36): 7 scratch blocks -> 4 slots, 3 pages: 7 / 0.97
    # The batch fits: a request of that shape resumes and grows within the minimum.
    m = backend.KVCacheManager(config(0), None)
    assert stepped(m, 40).has_scratch_slots


def test_backends_agree(backends: list[kv_api.Backend]) -> None:
    """A scripted life: steps with rewinds, suspend/resume, commits; every observable equal."""

    def run(backend: kv_api.Backend) -> list[object]:
        manager = backend.KVCacheManager(config(8), None)
        out: list[object] = []
        caches = [stepped(manager, 40), stepped(manager, 40, 8)]
        for cap, hist in [(48, 36), (60, 44), (72, 60)]:
            for c in caches:
                c.commit(toks(hist - c.num_committed_tokens, c.num_committed_tokens))
                out.append(c.resize(cap, hist))
                d = c.get_scratch_desc(WINDOW)
                out.append((list(c.get_base_page_indices(WINDOW)), d))
            caches[0].suspend()
            out.append(manager.get_storage_statistics())
            assert caches[0].resume()
            out.append(caches[0].get_scratch_desc(WINDOW))
        for c in caches:
            c.close()
        check_accounting(manager, open_caches=False)
        out.append(manager.get_storage_statistics())
        return out

    results = [run(b) for b in backends]
    for r in results[1:]:
        assert r == results[0]
