"""The remote tier (docs/store.md): a match that ends locally continues in a ``kv_api.BlockStore``,
what it brings holds exactly the bytes the writer's pages had, every value is checked before it
is used, and a store's faults are misses. ``RecordingStore`` keeps every call, so two backends
can be held to the same calls with the same keys and bytes (``_store.py``)."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Sequence
from typing import Any, cast

import pytest

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
    MemoryBlockStore,
    RemoteCacheTierConfig,
    ReuseScope,
)
from kv_api.block_value import read_header, store_namespace

from .._manager import GRAIN, active, check_accounting, life_cycles, slot_bytes, toks
from .._store import RecordingStore
from ..test_manager_page_data import write_all

pytestmark = pytest.mark.requires("remote_tier")

TPB = 4
LAYERS = [
    AttentionLayerConfig(0, [BufferConfig("key", 1024), BufferConfig("value", 1024), BufferConfig("scale", 64)]),
    AttentionLayerConfig(1, [BufferConfig("key", 512), BufferConfig("value", 512)], sliding_window_size=8),
]


def config(store: kv_api.BlockStore, model: str = "m", host: bool = False, layers: Any = None) -> KVCacheManagerConfig:
    tiers: list[Any] = [GpuCacheTierConfig(GRAIN)]
    if host:
        tiers.append(HostCacheTierConfig(GRAIN))
    return KVCacheManagerConfig(TPB, [*tiers, RemoteCacheTierConfig(store, model, "r1")], layers or LAYERS)


def write_prompt(manager: Any, tokens: list[int], seed: int, scope: ReuseScope | None = None) -> dict[Any, bytes]:
    """A cache of ``tokens`` whose every page holds a pattern; committed and closed."""
    cache = active(manager, len(tokens), scope=scope)
    written = write_all(manager, cache, seed)
    cache.commit(tokens)
    cache.close()
    return written


def read_pages(manager: Any, cache: Any) -> dict[tuple[int, int], bytes]:
    out = {}
    for lc in life_cycles(manager):
        for o, slot in enumerate(cache.get_base_page_indices(lc.id)):
            if slot >= 0:
                out[lc.id, o] = slot_bytes(manager, lc.id, slot)
    return out


@pytest.mark.parametrize("host", [False, True], ids=["device", "host"])
def test_second_manager_reuses_the_first_ones_bytes(backend: kv_api.Backend, host: bool) -> None:
    if host and not backend.capabilities.host_tier:
        pytest.skip("needs host_tier")
    store = MemoryBlockStore()
    tokens = toks(22)
    writer = backend.KVCacheManager(config(store, host=host))
    written = write_prompt(writer, tokens, 1)
    assert writer.get_committed_stats().remote_written == 5  # the full blocks
    assert len(store.values) == 5
    reader = backend.KVCacheManager(config(store, host=host))
    cache = reader.create_kv_cache(None, tokens)
    assert cache.num_committed_tokens == 20
    levels = cache.cached_tokens_by_level
    assert levels[-1] == 20 and sum(levels) == 20 and len(levels) == (3 if host else 2)
    stats = reader.get_committed_stats()
    assert (stats.remote_lookups, stats.remote_blocks, stats.remote_rejected) == (1, 5, 0)
    assert stats.reused_tokens == 20
    assert cache.resume()
    got = read_pages(reader, cache)
    # Window pages out of the window at the writer's end are not stored: compare what both have.
    assert got and all(got[k] == written[k] for k in got), "a remote page's bytes differ from the writer's"
    assert {k for k in got if k[0] == 0} == {(0, o) for o in range(5)}
    cache.close()
    check_accounting(reader, open_caches=False)
    # Now local: a third cache reuses them without asking the store again.
    again = reader.create_kv_cache(None, tokens)
    assert again.num_committed_tokens == 20 and again.cached_tokens_by_level[-1] == 0
    assert reader.get_committed_stats().remote_blocks == 5
    again.close()


def test_the_store_continues_a_local_match(backend: kv_api.Backend) -> None:
    store = RecordingStore()
    first, second = backend.KVCacheManager(config(store)), backend.KVCacheManager(config(store))
    write_prompt(first, toks(16), 1)
    write_prompt(second, toks(8), 2)  # the first two blocks are local to the second manager
    store.calls.clear()
    cache = second.create_kv_cache(None, toks(16))
    assert cache.num_committed_tokens == 16 and cache.cached_tokens_by_level == [8, 8]
    ns = store_namespace("m", "r1", second.init_config)
    method, keys, _ = store.calls[0]
    assert method == "contains" and len(keys) == 2 and all(k.startswith(ns) for k in keys)
    assert all(k in store.values for k in keys)
    cache.close()


class KeptKeys(MemoryBlockStore):
    """Keeps the key sequences the manager hands it, to read after the call."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[tuple[str, Sequence[bytes]]] = []

    def contains(self, keys: Sequence[bytes]) -> int:
        self.handed.append(("contains", keys))
        return super().contains(keys)

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        self.handed.append(("get_into", keys))
        return super().get_into(keys, buffers)


def test_the_store_is_handed_store_keys(backend: kv_api.Backend) -> None:
    """Both backends hand ``contains`` and ``get_into`` a ``kv_api.StoreKeys``: a sequence of the
    store keys that still reads them after the call, and refuses a bad index as a list does."""
    store = KeptKeys()
    write_prompt(backend.KVCacheManager(config(store)), toks(20), 1)
    reader = backend.KVCacheManager(config(store))
    store.handed.clear()
    cache = reader.create_kv_cache(None, toks(16))
    assert cache.num_committed_tokens == 16
    cache.close()
    assert [method for method, _ in store.handed] == ["contains", "get_into"]
    ns = store_namespace("m", "r1", reader.init_config)
    for _, keys in store.handed:
        assert type(keys) is kv_api.StoreKeys and len(keys) == 4
        listed = list(keys)
        assert all(k.startswith(ns) and len(k) == len(ns) + 32 and k in store.values for k in listed)
        assert keys == listed and keys[-1] == listed[3] and keys[1:3] == listed[1:3] and keys[::-2] == listed[::-2]
        with pytest.raises(IndexError):
            keys[4]
        with pytest.raises(TypeError, match="integers or slices"):
            keys["0"]  # type: ignore[call-overload]


def test_namespaces_and_scopes_are_isolated(backend: kv_api.Backend) -> None:
    store = MemoryBlockStore()
    write_prompt(backend.KVCacheManager(config(store)), toks(16), 1, scope=ReuseScope(salt=1))
    other_model = backend.KVCacheManager(config(store, model="other"))
    assert other_model.create_kv_cache(ReuseScope(salt=1), toks(16)).num_committed_tokens == 0
    other_layout = backend.KVCacheManager(config(store, layers=[AttentionLayerConfig(0, [BufferConfig("key", 1024)])]))
    assert other_layout.create_kv_cache(ReuseScope(salt=1), toks(16)).num_committed_tokens == 0
    same = backend.KVCacheManager(config(store))
    assert same.create_kv_cache(ReuseScope(salt=2), toks(16)).num_committed_tokens == 0
    assert same.create_kv_cache(None, toks(16)).num_committed_tokens == 0
    assert same.create_kv_cache(ReuseScope(salt=1), toks(16)).num_committed_tokens == 16


def _tamper(value: bytes, how: str, other: bytes) -> bytes:
    if how == "garbage":
        return bytes((i * 37 + 11) & 0xFF for i in range(len(value)))
    if how == "payload":  # one byte of the pages flipped: the checksum fails
        return value[:-1] + bytes([value[-1] ^ 1])
    if how == "header checksum":  # the header as written, its own CRC-32 damaged
        at = read_header(value).size - 8  # type: ignore[union-attr]
        return value[:at] + bytes([value[at] ^ 1]) + value[at + 1 :]
    if how == "key":  # another block's value (a valid value, under the wrong key)
        return other
    if how == "truncated":
        return value[: len(value) // 2]
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["garbage", "payload", "header checksum", "key", "truncated"])
def test_a_bad_value_is_a_miss_never_data(backend: kv_api.Backend, how: str) -> None:
    store = MemoryBlockStore()
    write_prompt(backend.KVCacheManager(config(store)), toks(16), 1)
    keys = sorted(store.values, key=lambda k: read_header(store.values[k]).prefix_tokens)  # type: ignore[union-attr]
    store.values[keys[2]] = _tamper(store.values[keys[2]], how, store.values[keys[1]])
    reader = backend.KVCacheManager(config(store))
    cache = reader.create_kv_cache(None, toks(16))
    assert cache.num_committed_tokens == 8  # the two blocks before the bad one
    stats = reader.get_committed_stats()
    assert stats.remote_blocks == 2
    # A wrong length is the store's to refuse (its own counter); the rest the manager's.
    assert stats.remote_rejected == (0 if how == "truncated" else 1)
    assert store.num_bad_values == (1 if how == "truncated" else 0)
    cache.close()


def test_another_layouts_value_is_refused(backend: kv_api.Backend) -> None:
    """A value of a layout with the same value size but another fingerprint, under our key."""
    store = MemoryBlockStore()
    write_prompt(backend.KVCacheManager(config(store)), toks(8), 1)
    other = [
        LAYERS[0],
        AttentionLayerConfig(1, [BufferConfig("key", 512), BufferConfig("value", 512)], sliding_window_size=12),
    ]
    foreign = MemoryBlockStore()
    write_prompt(backend.KVCacheManager(config(foreign, layers=other)), toks(8), 1)
    mine = sorted(store.values, key=lambda k: read_header(store.values[k]).prefix_tokens)  # type: ignore[union-attr]
    theirs = sorted(foreign.values, key=lambda k: read_header(foreign.values[k]).prefix_tokens)  # type: ignore[union-attr]
    assert len(store.values[mine[0]]) == len(foreign.values[theirs[0]])
    store.values[mine[0]] = foreign.values[theirs[0]]
    reader = backend.KVCacheManager(config(store))
    assert reader.create_kv_cache(None, toks(8)).num_committed_tokens == 0
    assert reader.get_committed_stats().remote_rejected == 1


class FailingStore(MemoryBlockStore):
    """Raises, or answers out of range, from the method named ``broken``."""

    def __init__(self, broken: str, answer: Any = None) -> None:
        super().__init__()
        self.broken, self.answer = broken, answer

    def contains(self, keys: Sequence[bytes]) -> int:
        return cast(int, self._maybe("contains", super().contains(keys)))

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        return cast(int, self._maybe("get_into", super().get_into(keys, buffers)))

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        self._maybe("put", None)
        super().put(keys, values)

    def _maybe(self, method: str, result: Any) -> Any:
        if method != self.broken:
            return result
        if self.answer is None:
            raise ConnectionError("store down")
        return self.answer


@pytest.mark.parametrize(
    ("broken", "answer"),
    [("contains", None), ("get_into", None), ("contains", 99), ("get_into", -1), ("contains", "2")],
)
def test_a_failing_store_costs_misses(backend: kv_api.Backend, broken: str, answer: Any) -> None:
    good = MemoryBlockStore()
    write_prompt(backend.KVCacheManager(config(good)), toks(16), 1)
    store = FailingStore(broken, answer)
    store.values.update(good.values)
    reader = backend.KVCacheManager(config(store))
    cache = reader.create_kv_cache(None, toks(16))
    assert cache.num_committed_tokens == 0
    assert reader.get_committed_stats().remote_errors == 1
    cache.close()
    check_accounting(reader, open_caches=False)


def test_a_failing_put_never_fails_the_commit(backend: kv_api.Backend) -> None:
    store = FailingStore("put")
    manager = backend.KVCacheManager(config(store))
    write_prompt(manager, toks(16), 1)
    stats = manager.get_committed_stats()
    assert (stats.remote_written, stats.remote_errors, stats.committed_blocks) == (0, 1, 4)
    assert manager.create_kv_cache(None, toks(16)).num_committed_tokens == 16  # still local


class PausingStore(RecordingStore):
    """Answers its puts with ``answers`` in turn (then None): a store that is down asks for a pause."""

    def __init__(self, *answers: object) -> None:
        super().__init__()
        self.answers = list(answers)

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> Any:
        super().put(keys, values)
        return self.answers.pop(0) if self.answers else None


def puts(store: RecordingStore) -> int:
    return sum(method == "put" for method, _, _ in store.calls)


@pytest.mark.parametrize("pause", [math.inf, 3600, 3600.0, 10**400], ids=["inf", "int", "float", "huge int"])
def test_a_paused_store_is_handed_nothing(backend: kv_api.Backend, pause: object) -> None:
    """A put answered with a pause: for that long the commits' blocks are neither encoded nor
    handed over (counted as skipped), and the commits and local reuse go on."""
    store = PausingStore(pause)
    manager = backend.KVCacheManager(config(store))
    write_prompt(manager, toks(8), 1)
    write_prompt(manager, toks(12, 50), 2)
    write_prompt(manager, toks(4, 90), 3)
    stats = manager.get_committed_stats()
    assert puts(store) == 1
    assert (stats.remote_written, stats.remote_skipped, stats.remote_errors) == (2, 4, 0)
    cache = manager.create_kv_cache(None, toks(12, 50))
    assert cache.num_committed_tokens == 12  # still local
    cache.close()


@pytest.mark.parametrize(
    "answer",
    [None, 0, -5, -math.inf, math.nan, True, "10", [10], -(10**400)],
    ids=["none", "zero", "negative", "-inf", "nan", "bool", "str", "list", "huge negative"],
)
def test_no_pause_but_a_positive_number(backend: kv_api.Backend, answer: object) -> None:
    store = PausingStore(answer)
    manager = backend.KVCacheManager(config(store))
    write_prompt(manager, toks(8), 1)
    write_prompt(manager, toks(8, 50), 2)
    stats = manager.get_committed_stats()
    assert puts(store) == 2 and (stats.remote_written, stats.remote_skipped) == (4, 0)


def test_a_pause_ends(backend: kv_api.Backend) -> None:
    store = PausingStore(0.3, None)
    manager = backend.KVCacheManager(config(store))
    write_prompt(manager, toks(4), 1)
    write_prompt(manager, toks(4, 50), 2)  # within the pause
    time.sleep(0.4)
    write_prompt(manager, toks(4, 90), 3)
    stats = manager.get_committed_stats()
    assert puts(store) == 2 and (stats.remote_written, stats.remote_skipped) == (2, 1)


def test_what_the_store_brings_stays_in_the_tree_when_room_empties_the_root(backend: kv_api.Backend) -> None:
    """Room for the store's blocks evicts every local block of their scope, so the scope's root
    goes and comes back: the blocks brought hang under the tree's root, found by later matches."""
    layers = [AttentionLayerConfig(0, [BufferConfig("key", 1024)])]
    scope = ReuseScope(salt=7)
    store = MemoryBlockStore()
    write_prompt(backend.KVCacheManager(config(store, layers=layers)), toks(20), 1, scope=scope)
    reader = backend.KVCacheManager(config(MemoryBlockStore(), layers=layers))
    total = reader.get_storage_statistics(0)[0].total
    write_prompt(reader, toks(8, 500), 2, scope=scope)  # the scope's only local blocks, least recent
    write_prompt(reader, toks((total - 2) * TPB, 1000), 3)  # the rest of the pool, another scope
    assert reader.get_storage_statistics(0)[0].free == 0
    reader.init_config.cache_tiers[-1].store.values.update(store.values)  # type: ignore[union-attr]
    cache = reader.create_kv_cache(scope, toks(20))
    assert cache.num_committed_tokens == 20 and reader.probe_reuse(scope, toks(8, 500)) == 0
    cache.close()
    assert reader.probe_reuse(scope, toks(20)) == 20
    check_accounting(reader, open_caches=False)


def test_max_reused_tokens_bounds_the_fetch(backend: kv_api.Backend) -> None:
    store = RecordingStore()
    write_prompt(backend.KVCacheManager(config(store)), toks(16), 1)
    store.calls.clear()
    reader = backend.KVCacheManager(config(store))
    cache = reader.create_kv_cache(None, toks(16), max_reused_tokens=9)
    assert cache.num_committed_tokens == 8
    assert [len(keys) for method, keys, _ in store.calls if method == "contains"] == [2]


def test_probes_stay_local(backend: kv_api.Backend) -> None:
    store = RecordingStore()
    write_prompt(backend.KVCacheManager(config(store)), toks(16), 1)
    store.calls.clear()
    reader = backend.KVCacheManager(config(store))
    assert reader.probe_reuse(None, toks(16)) == 0
    assert store.calls == []


@pytest.mark.requires("batched_calls")
def test_a_batched_commit_stages_its_blocks_in_batch_order(backend: kv_api.Backend) -> None:
    """``commit_many``: the blocks its commits complete are staged after the last commit, in
    batch order, and the next close hands them over in one put (a decode iteration's blocks)."""
    store = RecordingStore()
    manager = backend.KVCacheManager(config(store))
    caches = [active(manager, 8) for _ in range(3)]
    store.calls.clear()
    manager.commit_many(caches, toks(8) + toks(2, 100) + toks(8, 200), [8, 2, 8])
    assert puts(store) == 0  # 4 blocks staged: fewer than a put's 16
    # A commit that raises: the blocks of the ones before it are still staged.
    with pytest.raises(ValueError):
        manager.commit_many(caches[1:], toks(6, 300) + toks(1, 500), [6, 1])  # the third cache is full
    caches[0].close()
    put = [(keys, values) for method, keys, values in store.calls if method == "put"]
    assert len(put) == 1 and len(put[0][0]) == 6  # two full blocks each of the first and third, then the second's two
    headers = [read_header(v) for v in put[0][1]]
    assert [h.prefix_tokens for h in headers if h is not None] == [4, 8, 4, 8, 4, 8]
    assert manager.get_committed_stats().remote_written == 6
    for cache in caches:
        cache.close()
    assert puts(store) == 1  # nothing was left staged


def test_a_decode_stages_its_blocks(backend: kv_api.Backend) -> None:
    """A decode's blocks, one a step in a while, are staged and go in puts of 16; a close hands
    the rest over, and so does a cache's creation (what is staged is there before it is read)."""
    store = RecordingStore()
    manager = backend.KVCacheManager(config(store, layers=LAYERS[:1]))
    cache = active(manager, 4 * 40)
    for step in range(4 * 40):
        cache.commit([1000 + step])
        assert [len(keys) for method, keys, _ in store.calls if method == "put"] == [16] * ((step + 1) // 64)
    assert manager.get_committed_stats().remote_written == 32
    other = manager.create_kv_cache(None, toks(8, 5000))  # no local match: the store is asked
    assert [m for m, _, _ in store.calls][-3:] == ["put", "put", "contains"]
    assert [len(keys) for method, keys, _ in store.calls if method == "put"] == [16, 16, 8]
    other.close()
    cache.close()
    assert manager.get_committed_stats().remote_written == 40 and puts(store) == 3
    reader = backend.KVCacheManager(config(store, layers=LAYERS[:1]))
    assert reader.create_kv_cache(None, [1000 + i for i in range(160)]).num_committed_tokens == 160


def test_a_dropped_cache_never_calls_the_store(backend: kv_api.Backend) -> None:
    """A cache its owner drops is closed by its finaliser without a store call (a finaliser may
    run inside the store's own code); what it staged goes at the next close."""
    store = RecordingStore()
    manager = backend.KVCacheManager(config(store))
    cache = active(manager, 8)
    cache.commit(toks(8))
    store.calls.clear()
    del cache
    gc.collect()
    assert store.calls == []
    manager.create_kv_cache(None, toks(4, 100)).close()  # a creation: what is staged first, then the read
    assert [(m, len(keys)) for m, keys, _ in store.calls] == [("put", 2), ("contains", 1)]
    assert manager.get_committed_stats().remote_written == 2


class DroppingStore(MemoryBlockStore):
    """Runs ``drop`` (once) at the start of its ``method``: a finaliser run inside the store's
    own code, as a garbage collection there may run one."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method
        self.drop: Any = None

    def _maybe_drop(self, method: str) -> None:
        if method == self.method and self.drop is not None:
            drop, self.drop = self.drop, None
            drop()

    def contains(self, keys: Sequence[bytes]) -> int:
        self._maybe_drop("contains")
        return super().contains(keys)

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        self._maybe_drop("get_into")
        return super().get_into(keys, buffers)


@pytest.mark.parametrize("window", [None, 8], ids=["attention", "window"])
@pytest.mark.parametrize("method", ["contains", "get_into"])
def test_a_cache_finalised_inside_the_store_leaves_the_match_whole(
    backend: kv_api.Backend, method: str, window: int | None
) -> None:
    """The only other holder of a match's local blocks is dropped (finalised) inside the store's
    call that continues the match, in a pool with no other page to evict: the match keeps its
    blocks' pages (their release mid-call makes no room for the store's blocks), nothing breaks."""
    layers = [AttentionLayerConfig(0, [BufferConfig("key", 64 << 10)])]  # 32 slots in a grain
    if window is not None:
        layers.append(AttentionLayerConfig(1, [BufferConfig("key", 64 << 10)], sliding_window_size=window))
    store = DroppingStore(method)
    write_prompt(backend.KVCacheManager(config(store, layers=layers)), toks(40), 1)
    manager = backend.KVCacheManager(config(store, layers=layers))
    holder = [manager.create_kv_cache(None, toks(16))]  # its 4 blocks from the store
    assert holder[0].resume() and holder[0].num_committed_tokens == 16
    path = list(holder[0].get_base_page_indices(0))
    other = active(manager, 0)  # grown a token at a time until 2 slots are left free
    capacity = 0
    while manager.get_storage_statistics(0)[0].free > 2:
        capacity += 1
        assert other.resize(capacity)
    store.drop = holder.clear
    cache = manager.create_kv_cache(None, toks(40))
    assert not holder and store.drop is None, "the cache was finalised inside the store's call"
    assert backend.poison_reason() is None
    assert cache.cached_tokens_by_level[0] == 16 and cache.num_committed_tokens > 16
    assert cache.resume()
    assert list(cache.get_base_page_indices(0))[:4] == path
    check_accounting(manager, open_caches=True)
    cache.close()
    other.close()
    check_accounting(manager, open_caches=False)


def test_backends_make_the_same_store_calls(backends: list[kv_api.Backend]) -> None:
    """Same config, same calls, two backends: the same store calls with the same keys and bytes."""
    recorded = []
    for backend in backends:
        store = RecordingStore()
        writer = backend.KVCacheManager(config(store))
        write_prompt(writer, toks(22), 3)
        write_prompt(writer, toks(10) + toks(9, 100), 4)
        reader = backend.KVCacheManager(config(store))
        write_prompt(reader, toks(6), 5)
        cache = reader.create_kv_cache(None, toks(22))
        cache.resume()
        cache.close()
        recorded.append(store.calls)
    for other in recorded[1:]:
        assert other == recorded[0]
