"""Sliding-window scratch at its edges (docs/manager.md, "Sliding-window scratch"): the range when
``capacity - max_rewind_len`` is not positive, ``slot_util_frac_max`` of a one-byte layer, of a
buffer stored at a finer granularity and of window layers listed after an SSM layer, a commit
that keeps every scratch block inside the new scratch range, and the refusal's message.
"""

from __future__ import annotations

import pytest

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    KVCacheManagerConfig,
    ScratchDesc,
    SsmLayerConfig,
    SwaScratchReuseConfig,
)

from ._manager import GRAIN, fails_atomically, raises_exactly, toks
from .test_swa_scratch import stepped

# Every test here configures scratch reuse.
pytestmark = pytest.mark.requires("swa_scratch")


def kv(size: int, tokens_per_block_override: int | None = None) -> list[BufferConfig]:
    return [
        BufferConfig("key", size, tokens_per_block_override),
        BufferConfig("value", size, tokens_per_block_override),
    ]


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


def test_two_windows_drop_their_pages_entering_scratch_in_one_resize(backends: list[kv_api.Backend]) -> None:
    """Windows of 8 and 12 tokens (two life cycles, layer groups 1 and 2), rewind 64. At
    capacity 16 and history 0 nothing is stale at max(0, 16 - 64) = 0, so blocks 0-3 have pages
    in both windows. Resized to 100 from the same history, the scratch ranges are the blocks
    stale at 36 from block 0: 0-6 for the window of 8, 0-5 for the window of 12; blocks 0-3 of
    both give their pages up in that one resize (``KVCache.resize__mutmut_111`` kept only the
    last life cycle's drops) and read BAD_PAGE_INDEX. Every backend ends alike."""
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
