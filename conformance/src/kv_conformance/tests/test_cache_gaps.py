"""KV cache behaviour that mutation testing of the Python backend (docs/mutation.md) found
unchecked: the length setters with SWA scratch reuse, ``prefetch``'s level argument and what it
moves, and the exact messages of the cache's refusals. Every backend must pass them."""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Sequence

import pytest

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    HostMemoryCopier,
    KVCacheManagerConfig,
    KVCacheStatus,
    PageCopier,
    SsmLayerConfig,
    StorageStatistics,
    SwaScratchReuseConfig,
)
from kv_api.contract import Buffer
from kv_api.errors import LogicError, OutOfPagesError

from ._manager import (
    GRAIN,
    active,
    check_accounting,
    fill_slot,
    hybrid_config,
    make_config,
    make_manager,
    pool_group_of,
    raises_exactly,
    slot_bytes,
    toks,
)
from ._tiers import World, h, page_levels, tier_config, world_state

TPB = 4  # as _tiers'


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


def test_capacity_setter_out_of_pages_names_the_length(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=4))
    cache = active(manager, 8)

    def grow() -> None:
        cache.capacity = 4 * TPB + 1

    assert str(raises_exactly(OutOfPagesError, grow)) == "capacity: not enough pages"
    assert cache.capacity == 8
    cache.close()


def test_plan_committed_block_drop_before_stop_committing_message(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    cache = active(manager, 8, toks(6))
    err = raises_exactly(LogicError, cache.plan_committed_block_drop)
    assert str(err) == "plan_committed_block_drop() requires stop_committing()"
    cache.close()


def test_prefetch_level_argument_messages(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, make_config(TPB, slots=8))
    cache = active(manager, 8, toks(6))
    cache.suspend()
    assert str(raises_exactly(ValueError, lambda: cache.prefetch(-1))) == "target_level: must be >= 0 (got -1)"
    err = raises_exactly(TypeError, lambda: cache.prefetch("0"))  # type: ignore[arg-type]
    assert str(err) == "target_level: expected an int, got str"
    assert str(raises_exactly(IndexError, lambda: cache.prefetch(1))) == "target_level 1 out of range (0..0)"
    cache.close()


def test_prefetch_to_a_full_level_where_the_pages_already_are(backend: kv_api.Backend) -> None:
    """Pages already at the target level need no room there: prefetch succeeds on a full
    device, moving nothing."""
    manager = make_manager(backend, make_config(TPB, slots=8))
    reader = active(manager, 8, toks(6))
    reader.suspend()
    other = active(manager, 6 * TPB)  # the other six slots, locked
    assert manager.get_storage_statistics() == [StorageStatistics(8, 0, 0)]  # held at the last level: kept
    assert reader.prefetch(0)
    assert reader.prefetch()
    assert list(reader.get_page_levels(0)) == [0, 0]
    assert reader.status == KVCacheStatus.SUSPENDED
    other.close()
    assert reader.resume()
    reader.close()


def test_index_buffer_too_short_message(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, hybrid_config(TPB, slots=32, window=8))
    cache = active(manager, 9)
    err = raises_exactly(ValueError, lambda: cache.set_base_page_index_buf(0, 0, array("i", [0, 0])))
    assert str(err) == "buf: too short (2 < 3 blocks)"
    cache.close()


def int32_buffer(fmt: str, n: int) -> tuple[Buffer, memoryview]:
    """A writable buffer of ``n`` int32 whose memoryview reports ``fmt``, and a view to read it."""
    if fmt == "<i":
        raw = (ctypes.c_int32 * n)()
        return raw, memoryview(raw).cast("B").cast("i")
    view = memoryview(bytearray(4 * n)).cast("B").cast("@i" if fmt == "@i" else "i")
    return view, view


@pytest.mark.parametrize("fmt", ["i", "@i", "<i"])
def test_index_buffer_formats_of_a_native_int32(backend: kv_api.Backend, fmt: str) -> None:
    """Each spelling of a native int32 is accepted (``'<i'``: ctypes; the backends run on
    little-endian machines)."""
    manager = make_manager(backend, hybrid_config(TPB, slots=32, window=8))
    cache = active(manager, 9)
    buf, view = int32_buffer(fmt, 4)
    assert memoryview(buf).format == fmt
    cache.set_base_page_index_buf(0, 0, buf)
    expected = list(cache.get_base_page_indices(0))
    assert expected != [-1] * 3
    assert list(view) == [*expected, -1]
    cache.close()


@pytest.mark.requires("host_tier")
def test_prefetch_never_evicts_the_cache_own_pages(backend: kv_api.Backend) -> None:
    """Room for the pages prefetch brings up is not made by pushing down the cache's other
    pages: with the device full but for one of them, prefetch is refused and nothing moves."""
    world = World(backend, tier_config(["host"]))  # device 8 slots, host 4
    m = world.manager
    reader = active(m, 2 * TPB, toks(8))
    reader.suspend()
    other = active(m, 7 * TPB)  # one of the reader's held pages falls to the host
    assert sorted(page_levels(reader)) == [0, 1]
    assert m.get_storage_statistics(0) == [StorageStatistics(8, 0, 1)]
    before = world_state(world, [reader, other])
    assert reader.prefetch(0) is False
    assert world_state(world, [reader, other]) == before
    other.close()
    assert reader.prefetch(0)
    assert page_levels(reader) == [0, 0]
    reader.close()


SSM = 1  # ssm_config's SSM layer group


def ssm_config() -> KVCacheManagerConfig:
    """Full attention (layer group 0) and an SSM layer (layer group 1) of another slot size (so
    another pool group), commit_min_snapshot."""
    kv = [BufferConfig("key", 4096), BufferConfig("value", 4096)]
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [
        AttentionLayerConfig(0, kv),
        SsmLayerConfig(1, [BufferConfig("state", 16384)]),
    ]
    return KVCacheManagerConfig(TPB, [GpuCacheTierConfig(2 * GRAIN)], layers, commit_min_snapshot=True)


class FailingCopier(PageCopier):
    """``HostMemoryCopier`` that raises while ``fail`` is set."""

    def __init__(self) -> None:
        self.fail = False
        self.inner = HostMemoryCopier()

    def copy(self, src_level: int, dst_level: int, runs: Sequence[tuple[int, int, int]]) -> None:
        if self.fail:
            raise RuntimeError("copier failed")
        self.inner.copy(src_level, dst_level, runs)


@pytest.mark.requires("ssm_layers")
def test_a_failing_snapshot_copy_frees_the_copies(backend: kv_api.Backend) -> None:
    """commit_min_snapshot copies the partial tail into new pages; when the copy fails the
    copier's error propagates and the new pages are freed (nothing leaks)."""
    copier = FailingCopier()
    m = backend.KVCacheManager(ssm_config(), None, copier)
    free = [s.free for s in m.get_storage_statistics()]
    cache = m.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(16, 6)
    copier.fail = True
    err = raises_exactly(RuntimeError, lambda: cache.commit(toks(6)))
    assert str(err) == "copier failed"
    copier.fail = False
    cache.close()
    assert [s.free + s.evictable for s in m.get_storage_statistics()] == free
    assert [s.free for s in m.get_storage_statistics()] != free  # the first block was committed


@pytest.mark.requires("host_tier")
def test_a_partial_tail_committed_from_the_host_is_stored_at_the_host_level(backend: kv_api.Backend) -> None:
    """Closing a suspended cache whose pages fell to the host commits its partial tail there:
    the ``Stored`` event names the host level, not the device."""
    world = World(backend, tier_config(["host"]))
    m = world.manager
    reader = active(m, 2 * TPB, toks(6))
    assert world.step().stored == [h(toks(4))]
    reader.suspend()
    other = active(m, 8 * TPB)  # both held pages fall to the host
    assert page_levels(reader) == [1, 1]
    assert world.step().moved == [(h(toks(4)), 0, 1)]
    reader.close()
    assert world.step().stored == [h(toks(6))]
    assert world.levels.level(h(toks(6))) == 1
    other.close()


@pytest.mark.requires("ssm_layers")
def test_a_state_committed_at_the_end_stays_evictable_after_suspend_and_close(backend: kv_api.Backend) -> None:
    """``commit(..., is_end=True)`` moves the live SSM state into the tree; suspending unlocks
    it and closing does not unlock it again: it ends evictable like every tree page."""
    m = backend.KVCacheManager(ssm_config(), None)
    cache = m.create_kv_cache(None, [])
    assert cache.resume() and cache.resize(8)
    cache.commit(toks(6), is_end=True)
    cache.suspend()
    cache.close()
    stats = m.get_storage_statistics()
    assert all(s.free + s.evictable == s.total for s in stats), stats
    assert stats[pool_group_of(m, SSM).index].evictable == 1
    check_accounting(m, open_caches=False)


@pytest.mark.requires("ssm_layers")
def test_an_empty_end_commit_of_a_zero_capacity_cache(backend: kv_api.Backend) -> None:
    """Nothing committed, no block: ``commit([], is_end=True)`` snapshots nothing."""
    m = backend.KVCacheManager(ssm_config(), None)
    cache = m.create_kv_cache(None, [])
    assert cache.resume()
    assert cache.num_blocks == 0
    cache.commit([], is_end=True)
    cache.close()
    check_accounting(m, open_caches=False)
    assert m.get_storage_statistics()[pool_group_of(m, SSM).index].evictable == 0


@pytest.mark.requires("ssm_layers")
def test_a_full_block_snapshot_is_not_replaced_by_a_later_writer(backend: kv_api.Backend) -> None:
    """A full block whose SSM snapshot covers it already keeps it: a second request committing
    the same tokens adds no copy of its own state, so a reader resumes from the first one's."""
    m = backend.KVCacheManager(ssm_config(), None)
    first = b""
    for seed in (1, 2):
        cache = m.create_kv_cache(None, [])
        assert cache.resume() and cache.resize(8)
        data = fill_slot(m, SSM, cache.get_ssm_block_base_index(SSM), seed)
        first = first or data
        cache.commit(toks(8))
        cache.close()
    reader = m.create_kv_cache(None, toks(8))
    assert reader.num_reused_tokens == 8
    assert reader.resume()
    assert slot_bytes(m, SSM, reader.get_ssm_block_base_index(SSM)) == first
    reader.close()


def test_a_resize_beyond_the_index_buffer_is_refused_with_its_message(backend: kv_api.Backend) -> None:
    """A resize to more blocks than an attached base page index buffer holds raises, naming the
    layer group and both lengths, and changes nothing (``KVCache.resize`` message)."""
    manager = make_manager(backend, hybrid_config(TPB, slots=32, window=8))
    cache = active(manager, 9)
    buf = array("i", [0] * 3)
    cache.set_base_page_index_buf(0, 0, buf)
    err = raises_exactly(ValueError, lambda: cache.resize(3 * TPB + 1))
    assert str(err) == "base page index buffer of layer group 0 too short: 3 < 4"
    assert cache.capacity == 9
    assert cache.resize(3 * TPB)  # within the buffer
    cache.close()
