"""Where a page's bytes are (docs/manager.md, "Page addresses"): ``get_buffer_location``, the
rule ``pool_memory(location)[page * stride : (page + 1) * stride]``, ``convert_into``, and the
page indices an engine reads: ``get_aggregated_page_indices``, base page index buffers (every
spelling of a native int32, exactly ``num_blocks`` long, detached with None; too short, unsigned
or naming a missing layer group refused) and index buffers that are tensors (a DLPack export, as
torch tensors have, instead of the buffer protocol)."""

from __future__ import annotations

import ctypes
from array import array
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_api import (
    BAD_PAGE_INDEX,
    AttentionLayerConfig,
    BufferConfig,
    BufferLocation,
    GpuCacheTierConfig,
    KVCacheManagerConfig,
    PageIndexMode,
    SsmLayerConfig,
)
from kv_api.contract import Buffer
from kv_api.descriptors import PageIndexConverter
from kv_api.errors import InvalidStateError

from ._manager import MIB, active, attention, hybrid_config, make_config, make_manager, raises_exactly, toks
from .test_manager_layout import ALL_BUFFERS, LAYOUT, TPB


class OnlyDlpack:
    """A tensor that exports DLPack only, as a torch tensor does (numpy provides the capsule)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)


def hybrid_layout() -> KVCacheManagerConfig:
    """Attention and an SSM layer whose conv and state buffers differ in size (two pools)."""
    kv = [BufferConfig("key", 2048), BufferConfig("value", 2048)]
    ssm = [BufferConfig("conv", 1024), BufferConfig("ssm", 16384)]
    layers: list[AttentionLayerConfig | SsmLayerConfig] = [AttentionLayerConfig(0, kv), SsmLayerConfig(7, ssm)]
    return KVCacheManagerConfig(TPB, [GpuCacheTierConfig(4 * MIB)], layers, commit_min_snapshot=True)


def check_locations(m: kv_api.KVCacheManager, buffers: list[tuple[int, str]]) -> None:
    descs = m.pool_group_descs
    for layer, role in buffers:
        loc = m.get_buffer_location(layer, role)
        assert isinstance(loc, BufferLocation)
        group = m.get_layer_group_id(layer)
        assert group in descs[loc.pool_group].life_cycles, (layer, role)
        assert loc.page_stride == m.get_page_stride(layer, role)
        pool = descs[loc.pool_group].pools[loc.pool]
        # The PER_LAYER base is the pool's own address: the converter carries the layer's offset.
        assert m.get_mem_pool_base_address(layer, role, PageIndexMode.PER_LAYER) == pool.base_address
        mem = m.pool_memory(loc.pool_group, loc.pool)
        assert np.frombuffer(mem, dtype=np.uint8).ctypes.data == pool.base_address
        assert m.get_page_index_upper_bound(layer, role) * loc.page_stride <= mem.nbytes


def test_buffer_location_names_the_pool(backend: kv_api.Backend) -> None:
    check_locations(backend.KVCacheManager(LAYOUT), ALL_BUFFERS)


@pytest.mark.requires("ssm_layers")
def test_ssm_buffers_sit_in_their_own_pools(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(hybrid_layout())
    check_locations(m, [(0, "key"), (0, "value"), (7, "conv"), (7, "ssm")])
    conv, state = m.get_buffer_location(7, "conv"), m.get_buffer_location(7, "ssm")
    assert conv.pool_group == state.pool_group and conv.pool != state.pool


def test_page_address_rule_gives_each_page_its_own_bytes(backend: kv_api.Backend) -> None:
    """Every (buffer, block) page of two live caches, addressed by the rule, is disjoint from
    every other and holds what was written there after the caches commit and grow."""
    m = backend.KVCacheManager(LAYOUT)
    caches = [active(m, 12, toks(8, 1)), active(m, 12, toks(8, 50))]
    owner: dict[tuple[int, int, int], tuple[int, int, str, int]] = {}
    written = {}
    for c, cache in enumerate(caches):
        for layer, role in ALL_BUFFERS:
            loc = m.get_buffer_location(layer, role)
            slots = cache.get_base_page_indices(m.get_layer_group_id(layer))
            pages = m.get_page_index_converter(layer, role)(slots)
            mem = m.pool_memory(loc.pool_group, loc.pool)
            for page in pages:
                if page == BAD_PAGE_INDEX:
                    continue
                for byte in range(page * loc.page_stride, (page + 1) * loc.page_stride, 61):
                    key = (loc.pool_group, loc.pool, byte)
                    assert key not in owner, (key, owner[key], (c, layer, role, page))
                    owner[key] = (c, layer, role, page)
                data = bytes([(c * 7 + layer * 3 + page) & 0xFF]) * loc.page_stride
                mem[page * loc.page_stride : (page + 1) * loc.page_stride] = data
                written[(c, layer, role, page)] = (loc, data)
    for (_, _, _, page), (loc, data) in written.items():
        mem = m.pool_memory(loc.pool_group, loc.pool)
        assert bytes(mem[page * loc.page_stride : (page + 1) * loc.page_stride]) == data


def test_buffer_location_errors(backend: kv_api.Backend) -> None:
    m = backend.KVCacheManager(LAYOUT)
    raises_exactly(KeyError, lambda: m.get_buffer_location(99, "key"))
    raises_exactly(KeyError, lambda: m.get_buffer_location(0, "nope"))
    raises_exactly(TypeError, lambda: m.get_buffer_location("0", "key"))  # type: ignore[arg-type]
    m.shutdown()
    raises_exactly(InvalidStateError, lambda: m.get_buffer_location(0, "key"))


CONVERTERS = st.builds(PageIndexConverter, st.integers(1, 4), st.integers(1, 3), st.integers(0, 3))
BASES = st.lists(st.one_of(st.just(BAD_PAGE_INDEX), st.integers(0, 1000)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(converter=CONVERTERS, bases=BASES, dtype=st.sampled_from(["int32", "int64"]), dlpack=st.booleans())
def test_convert_into_is_the_converter(
    converter: PageIndexConverter, bases: list[int], dtype: str, dlpack: bool
) -> None:
    for mode in (PageIndexMode.PER_LAYER, PageIndexMode.SHARED):
        src = np.array(bases, dtype=np.int32)
        out = np.full(len(bases) * converter.expansion + 2, 77, dtype=dtype)
        n = converter.convert_into(OnlyDlpack(src) if dlpack else src, OnlyDlpack(out) if dlpack else out, mode)
        assert n == len(bases) * converter.expansion
        assert out[:n].tolist() == converter(bases, mode)
        assert out[n:].tolist() == [77, 77]  # the tail is left alone


def test_convert_into_refuses_bad_buffers() -> None:
    c = PageIndexConverter(2, 2, 1)
    base = array("i", [0, 1])
    raises_exactly(ValueError, lambda: c.convert_into(base, array("q", [0] * 3)))  # too short
    raises_exactly(ValueError, lambda: c.convert_into(base, bytes(32)))  # read-only, bytes
    raises_exactly(ValueError, lambda: c.convert_into(base, np.zeros(4, dtype=np.float64)))
    raises_exactly(ValueError, lambda: c.convert_into(base, np.zeros((2, 2), dtype=np.int64)))
    raises_exactly(ValueError, lambda: c.convert_into(base, np.zeros(8, dtype=np.int64)[::2]))
    raises_exactly(TypeError, lambda: c.convert_into([0, 1], array("q", [0] * 4)))
    raises_exactly(TypeError, lambda: c.convert_into(base, object()))
    readonly = np.zeros(4, dtype=np.int64)
    readonly.flags.writeable = False
    raises_exactly(ValueError, lambda: c.convert_into(base, readonly))


def test_aggregated_page_indices_are_the_base_indices(backend: kv_api.Backend) -> None:
    """``get_aggregated_page_indices`` of a live cache (its default beam, ``valid_only`` and the
    int32 array) gives the base page indices."""
    manager = make_manager(backend, hybrid_config(TPB, slots=32, window=8))
    cache = active(manager, 21)
    assert cache.resize(None, 21)  # the window's blocks 0..2 are stale: BAD_PAGE_INDEX
    for layer_group in (0, 1):
        base = list(cache.get_base_page_indices(layer_group))
        got = cache.get_aggregated_page_indices(layer_group)
        assert isinstance(got, array) and got.typecode == "i"
        assert list(got) == base == list(cache.get_aggregated_page_indices(layer_group, 0, False))
        valid = cache.get_aggregated_page_indices(layer_group, valid_only=True)
        assert isinstance(valid, array) and valid.typecode == "i"
        assert list(valid) == [i for i in base if i != BAD_PAGE_INDEX]
    assert BAD_PAGE_INDEX in list(cache.get_aggregated_page_indices(1))
    assert len(cache.get_aggregated_page_indices(1, valid_only=True)) == cache.num_blocks - 3


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


def test_index_buffer_of_exactly_num_blocks_little_endian_and_detached(backend: kv_api.Backend) -> None:
    """A little-endian int32 buffer (format '<i', as ctypes exports it) exactly ``num_blocks``
    long is kept up to date until detached with None; an unsigned one is refused."""
    manager = make_manager(backend, make_config(TPB, slots=16))
    cache = active(manager, 3 * TPB)
    buf = (ctypes.c_int32 * 3)()
    assert memoryview(buf).format == "<i"
    cache.set_base_page_index_buf(0, 0, buf)
    assert list(buf) == list(cache.get_base_page_indices(0))
    assert BAD_PAGE_INDEX not in list(buf)
    cache.set_base_page_index_buf(0, 0, None)
    assert cache.resize(2 * TPB)
    assert BAD_PAGE_INDEX not in list(buf)  # detached: the shrink left it alone
    with pytest.raises(ValueError):
        cache.set_base_page_index_buf(0, 0, (ctypes.c_uint32 * 3)())


def test_index_buffer_too_short_message(backend: kv_api.Backend) -> None:
    manager = make_manager(backend, hybrid_config(TPB, slots=32, window=8))
    cache = active(manager, 9)
    err = raises_exactly(ValueError, lambda: cache.set_base_page_index_buf(0, 0, array("i", [0, 0])))
    assert str(err) == "buf: too short (2 < 3 blocks)"
    cache.close()


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


def test_detaching_from_a_missing_layer_group_is_an_error(backend: kv_api.Backend) -> None:
    """Layer groups are checked even when there is nothing to detach."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    cache = active(manager, TPB)
    cache.set_base_page_index_buf(0, 1, None)
    with pytest.raises(IndexError):
        cache.set_base_page_index_buf(0, 2, None)


def test_a_tensor_index_buffer_stays_current(backend: kv_api.Backend) -> None:
    """``set_base_page_index_buf`` takes a DLPack tensor as it takes a buffer, views it in place
    and keeps it equal to the indices through commit, resize and suspend."""
    m = backend.KVCacheManager(LAYOUT)
    cache = active(m, 8, toks(6, 1))
    store = np.full(10, 5, dtype=np.int32)
    cache.set_base_page_index_buf(0, 0, OnlyDlpack(store))

    def current() -> None:
        indices = list(cache.get_base_page_indices(0))
        assert store.tolist() == indices + [BAD_PAGE_INDEX] * (10 - len(indices))

    current()
    assert cache.resize(20)
    current()
    cache.commit(toks(10, 7))
    current()
    cache.suspend()
    current()
    assert cache.resume()
    current()
    cache.set_base_page_index_buf(0, 0, None)
    cache.close()


@pytest.mark.parametrize(
    ("tensor", "error", "message"),
    [
        (np.zeros(10, dtype=np.int64), ValueError, "buf: must be a writable 1-D buffer of format 'i' (got format 'q')"),
        (np.zeros(20, dtype=np.int32)[::2], ValueError, "buf: must be contiguous"),
        (np.zeros((2, 5), dtype=np.int32), ValueError, "buf: the tensor must be 1-D (got 2 dimensions)"),
        (np.zeros(10, dtype=np.float32), ValueError, "buf: unsupported tensor dtype (DLPack code 2, 32 bits)"),
    ],
)
def test_bad_tensor_index_buffers(backend: kv_api.Backend, tensor: np.ndarray, error: type, message: str) -> None:
    m = backend.KVCacheManager(LAYOUT)
    cache = active(m, 8, toks(6, 1))
    e = raises_exactly(error, lambda: cache.set_base_page_index_buf(0, 0, OnlyDlpack(tensor)))
    assert str(e) == message
    cache.close()


def test_torch_tensor_index_buffer(backend: kv_api.Backend) -> None:
    torch = pytest.importorskip("torch")
    m = backend.KVCacheManager(LAYOUT)
    cache = active(m, 8, toks(6, 1))
    t = torch.full((4,), 9, dtype=torch.int32)
    cache.set_base_page_index_buf(0, 0, t)
    assert t.tolist() == list(cache.get_base_page_indices(0)) + [BAD_PAGE_INDEX] * 2
    out = torch.zeros(8, dtype=torch.int64)
    conv = m.get_page_index_converter(0, "value")
    assert conv.convert_into(t, out) == 4 * conv.expansion
    assert out[: 4 * conv.expansion].tolist() == conv(t.tolist())
    cache.close()


def test_layout_version_counts_device_remaps(backend: kv_api.Backend) -> None:
    """``layout_version`` moves exactly when the device level's pools may have moved: a device
    resize that took effect (not a refused one, not one with a cache active) and not a lower
    level's resize or an ``adjust()`` with nothing to do."""
    tiers: list[Any] = [GpuCacheTierConfig(2 * MIB)]
    if backend.capabilities.host_tier:
        tiers.append(kv_api.HostCacheTierConfig(2 * MIB))
    m = backend.KVCacheManager(KVCacheManagerConfig(TPB, tiers, [attention(0, 64 * 1024)]))
    assert m.layout_version == 0
    committed_cache = active(m, 8, toks(8, 1))
    raises_exactly(InvalidStateError, lambda: m.resize(0, 4 * MIB))
    committed_cache.close()
    assert m.layout_version == 0
    assert not m.resize(0, 1)  # below the minimum quota: refused, nothing changed
    assert m.layout_version == 0
    assert m.resize(0, 4 * MIB)
    assert m.layout_version == 1
    assert m.resize(0, 2 * MIB)
    assert m.layout_version == 2
    if backend.capabilities.host_tier:
        assert m.resize(1, 4 * MIB)
        assert m.layout_version == 2
    assert not m.adjust()  # nothing learnt yet
    assert m.layout_version == 2
    m.shutdown()
    raises_exactly(InvalidStateError, lambda: m.layout_version)
