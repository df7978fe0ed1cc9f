"""Behaviour that mutation testing of the Python backend (``nox -s mutate``, docs/mutation.md)
found unchecked: each test names the surviving mutants it kills. Every backend must pass them."""

from __future__ import annotations

import ctypes
import random
import threading
import time
from array import array

import numpy as np
import pytest

import kv_api
from kv_api import BAD_PAGE_INDEX, KVCacheStatus, ReuseScope
from kv_api.constants import SHA256_U32
from kv_api.errors import InvalidStateError, OutOfPagesError
from kv_api.events import Created, Removed, Stored, UniqueToken

from ._manager import GRAIN, active, attention, committed, hybrid_config, make_config, make_manager, toks

TPB = 4


def test_aggregated_page_indices_are_the_base_indices(backend: kv_api.Backend) -> None:
    """``get_aggregated_page_indices`` (its default beam, ``valid_only`` and the int32 array) was
    never called on a live cache."""
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


def test_length_setters_change_their_own_length(backend: kv_api.Backend) -> None:
    """``cache.history_length = n`` resizes the history, not the capacity; both setters refuse
    None, a closed cache, and a capacity beyond the pool."""
    manager = make_manager(backend, make_config(TPB, slots=4))
    cache = active(manager, 8, toks(2))
    cache.history_length = 5
    assert (cache.num_committed_tokens, cache.history_length, cache.capacity) == (2, 5, 8)
    cache.capacity = 12
    assert (cache.history_length, cache.capacity) == (5, 12)
    for name in ("history_length", "capacity"):
        with pytest.raises(TypeError):
            setattr(cache, name, None)
    with pytest.raises(OutOfPagesError):
        cache.capacity = 4 * TPB + 1
    assert (cache.history_length, cache.capacity) == (5, 12)
    cache.close()
    assert cache.status == KVCacheStatus.CLOSED
    for name in ("history_length", "capacity"):
        with pytest.raises(InvalidStateError):
            setattr(cache, name, 8)


def test_probe_names_a_block_that_ends_the_tokens(backend: kv_api.Backend) -> None:
    """The first new block may end exactly where the tokens end: it is complete, so it has a key."""
    manager = make_manager(backend, make_config(TPB, slots=16))
    raw = kv_api.keys.block_keys(TPB, None, toks(2 * TPB))
    assert manager.probe_first_new_block_key(None, toks(TPB)) == raw[32:64]
    assert manager.probe_first_new_block_key(None, toks(2 * TPB)) == raw[32:64]


def test_block_hash_v1_with_wide_scope_ids(backend: kv_api.Backend) -> None:
    """Salts and LoRA ids beyond 32 bits go through every shift of the 64-bit mix (the suite's
    scopes were small, so a changed shift went unseen); checked against kv_api's reference."""
    rng = random.Random(10)
    for _ in range(50):
        scope = ReuseScope(rng.choice([None, rng.getrandbits(64)]), rng.choice([None, rng.getrandbits(64)]))
        tokens = [rng.getrandbits(rng.choice([8, 31])) for _ in range(rng.randint(1, 9))]
        parent = rng.choice([0, rng.getrandbits(64)])
        assert backend.block_hash_v1(tokens, parent, scope) == kv_api.keys.block_hash_v1(tokens, parent, scope)
    salt = "a salt whose id is wide"
    assert backend.cache_salt_to_id(salt) == kv_api.keys.cache_salt_to_id(salt) >= 1 << 32


def test_v1_events_fall_back_from_a_digest_block_on(backend: kv_api.Backend) -> None:
    """Under ``v1_block_key`` a block holding a digest token, and every block after it, is
    announced by its ``v2_sha256_64`` hash; the blocks before it keep their v1 hash."""
    events = backend.KVCacheEventManager(100, "v1_block_key")
    manager = make_manager(backend, make_config(TPB, slots=16), event_manager=events)
    digest = bytes(range(32))
    tokens: list[int | bytes] = [*toks(TPB), 1, digest, 2, 3, *toks(2 * TPB, 50)]
    cache = active(manager, len(tokens))
    cache.commit(tokens)
    cache.close()
    events.flush_iteration_events()
    hashes = [
        b.block_hash
        for e in events.get_latest_events(0)
        if isinstance(e.data, Stored) and e.layer_group_id == 0
        for b in e.data.blocks
    ]
    raw = kv_api.keys.block_keys(TPB, None, tokens)
    keys = [raw[i : i + 32] for i in range(32, len(raw), 32)]
    assert hashes == [
        kv_api.keys.block_hash_v1(toks(TPB), 0),
        *(kv_api.keys.block_hash_v2_sha256_64(k) for k in keys[1:]),
    ]


@pytest.mark.parametrize("high", [0x01010101, 0x7F000000, 1])
def test_u32_keys_refuse_wide_int64_buffers(backend: kv_api.Backend, high: int) -> None:
    """An int64 buffer whose items have their high half set (in every byte, or only one) is out of
    range for ``sha256-u32``, as the same values in a list are: never truncated to 32 bits."""
    values = [(high << 32) | 5] * (2 * TPB)
    with pytest.raises(ValueError):
        kv_api.keys.block_keys(TPB, None, values, SHA256_U32)
    with pytest.raises(ValueError):
        backend.block_keys(TPB, None, np.array(values, dtype=np.int64), SHA256_U32)
    with pytest.raises(ValueError):
        backend.block_keys(TPB, None, values, SHA256_U32)


def test_event_fields_on_a_window_manager(backend: kv_api.Backend) -> None:
    """Every event carries the manager's hash form and its layer group's window, Removed ones
    too; a Stored event extended by a later commit keeps its id and window (ids stay
    consecutive); a digest token is announced as its hex."""
    events = backend.KVCacheEventManager(100, "v2_sha256_64")
    config = make_config(TPB, slots=8, layers=[attention(0, GRAIN // 8, window=8)])
    manager = make_manager(backend, config, event_manager=events)
    digest = bytes(range(32))
    cache = active(manager, 2 * TPB)
    cache.commit([1, 2, digest, 3])
    cache.commit([4, 5, 6, 7])  # extends the chain just stored: one Stored event
    cache.close()
    big = active(manager, 8 * TPB)  # every slot: the first chain is evicted
    big.close()
    events.flush_iteration_events()
    got = list(events.get_latest_events(0))
    assert [e.event_id for e in got] == list(range(len(got)))
    assert [type(e.data) for e in got] == [Created, Stored, Removed]
    for e in got:
        assert e.hash_algo == "v2_sha256_64"
        assert e.window_size == (None if isinstance(e.data, Created) else 8)
    stored = got[1].data
    assert isinstance(stored, Stored) and len(stored.blocks) == 2
    assert stored.blocks[0].tokens == tuple(UniqueToken(t) for t in (1, 2, digest.hex(), 3))


def test_event_ring_sizes(backend: kv_api.Backend) -> None:
    """The ring holds ``max_kv_event_entries`` events, 1000 by default, and one when asked for
    one: one event more and it resyncs. With 8 slots, ``Created`` and 8 ``Stored``, then a
    ``Removed`` and a ``Stored`` per commit: 999 events after 503 commits, 1001 after 504."""
    for events, commits in ((backend.KVCacheEventManager(), 503), (backend.KVCacheEventManager(1, "v2_sha256"), 0)):
        manager = make_manager(backend, make_config(TPB, slots=8), event_manager=events)
        for i in range(commits):
            committed(manager, toks(TPB, 100 * i))
        events.flush_iteration_events()
        assert events.dropped_events == 0
        committed(manager, toks(TPB, 100 * commits))
        events.flush_iteration_events()
        got = list(events.get_latest_events(0))
        assert events.dropped_events == (2 * (commits + 1) - 7 if commits else 2)
        assert [type(e.data) for e in got] == [Created] + [Stored] * min(8, commits + 1)


def test_get_latest_events_without_a_timeout_waits_for_a_flush(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(100, "v2_sha256")
    manager = make_manager(backend, make_config(TPB, slots=8), event_manager=events)
    events.flush_iteration_events()
    assert len(events.get_latest_events(None)) == 1  # pending already: no wait

    def publish() -> None:
        time.sleep(0.05)
        committed(manager, toks(TPB))
        events.flush_iteration_events()

    thread = threading.Thread(target=publish)
    thread.start()
    got = events.get_latest_events(None)
    thread.join()
    assert [type(e.data) for e in got] == [Stored]


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


@pytest.mark.parametrize("history", [4 * TPB, 3 * TPB], ids=["exact", "one short"])
def test_growth_counts_the_window_pages_it_makes_evictable(backend: kv_api.Backend, history: int) -> None:
    """A resize that grows and moves the history past the window at once fits exactly when the
    free slots plus the committed window pages going stale (evictable then) cover the new
    pages; one slot fewer and it fails, changing nothing."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    cache = active(manager, 2 * TPB, toks(2 * TPB))  # 2 blocks x 2 life cycles, committed
    other = active(manager, 5 * TPB)  # another cache: 10 slots, 2 left free
    assert manager.get_storage_statistics()[0].free == 2
    # Growing to 4 blocks needs 4 new pages; at history 16 the window's blocks 0 and 1 go stale,
    # at history 12 only block 0.
    fits = history == 4 * TPB
    before = (cache.capacity, cache.history_length, list(cache.get_base_page_indices(1)))
    assert cache.resize(4 * TPB, history) is fits
    if fits:
        assert (cache.capacity, cache.history_length) == (4 * TPB, history)
    else:
        assert (cache.capacity, cache.history_length, list(cache.get_base_page_indices(1))) == before
    other.close()


@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
def test_growth_cannot_count_window_pages_another_cache_holds(backend: kv_api.Backend, shared: bool) -> None:
    """As above, exactly tight, but the window pages going stale are also held by another cache
    (it reused them): they stay in use, so the growth fails and changes nothing."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    first = active(manager, 2 * TPB, toks(2 * TPB))
    first.close()
    cache = active(manager, 2 * TPB, reuse=toks(2 * TPB))
    assert cache.num_committed_tokens == 2 * TPB
    holder = active(manager, 2 * TPB, reuse=toks(2 * TPB)) if shared else None
    other = active(manager, 5 * TPB)  # 10 slots: 2 left free
    assert manager.get_storage_statistics()[0].free == 2
    before = (cache.capacity, cache.history_length, list(cache.get_base_page_indices(1)))
    assert cache.resize(4 * TPB, 4 * TPB) is not shared
    if shared:
        assert (cache.capacity, cache.history_length, list(cache.get_base_page_indices(1))) == before
        assert holder is not None
        holder.close()
    other.close()


def test_detaching_from_a_missing_layer_group_is_an_error(backend: kv_api.Backend) -> None:
    """Layer groups are checked even when there is nothing to detach."""
    manager = make_manager(backend, hybrid_config(TPB, slots=16, window=8))
    cache = active(manager, TPB)
    cache.set_base_page_index_buf(0, 1, None)
    with pytest.raises(IndexError):
        cache.set_base_page_index_buf(0, 2, None)


@pytest.mark.parametrize("value", [-1, -5, -(2**56), -(2**63)])
@pytest.mark.parametrize("key_format", ["sha256-u32", "sha256-u64"])
def test_negative_ids_in_signed_buffers_are_refused(backend: kv_api.Backend, value: int, key_format: str) -> None:
    """Negative ids in an int64 buffer are out of range, whichever of their bytes is set."""
    values = [value, 1, 2, 3] * 2
    with pytest.raises(ValueError):
        kv_api.keys.block_keys(TPB, None, values, key_format)
    with pytest.raises(ValueError):
        backend.block_keys(TPB, None, np.array(values, dtype=np.int64), key_format)


@pytest.mark.requires("host_tier")
def test_iteration_stats_count_since_the_last_call(backend: kv_api.Backend) -> None:
    """``get_and_reset_iteration_stats`` counts what happened since the previous call, every
    counter (evicted and onboarded pages too), and starts afresh; the committed stats keep
    counting. (The suite never called it: every mutant of the reset survived.)"""
    config = kv_api.KVCacheManagerConfig(
        tokens_per_block=4,
        cache_tiers=[kv_api.GpuCacheTierConfig(GRAIN), kv_api.HostCacheTierConfig(GRAIN // 2)],
        layers=[attention(0, GRAIN // 8)],
    )
    m = backend.KVCacheManager(config)
    assert m.get_and_reset_iteration_stats() == kv_api.CacheStats()
    committed(m, toks(8))  # 1 request, 2 pages, 2 blocks
    first = m.get_and_reset_iteration_stats()
    assert first == kv_api.CacheStats(requests=1, allocated_pages=2, committed_blocks=2)
    assert m.get_and_reset_iteration_stats() == kv_api.CacheStats()
    big = active(m, 8 * 4)  # the device's 8 slots: the two committed pages fall to the host
    big.close()
    reader = m.create_kv_cache(None, toks(8))
    assert reader.resume()  # both come back
    reader.close()
    second = m.get_and_reset_iteration_stats()
    assert second == kv_api.CacheStats(
        requests=2, lookup_tokens=8, reused_tokens=8, allocated_pages=8, evicted_pages=2, onboarded_pages=2
    )
    assert m.get_committed_stats() == kv_api.CacheStats(
        requests=3,
        lookup_tokens=8,
        reused_tokens=8,
        allocated_pages=10,
        evicted_pages=2,
        committed_blocks=2,
        onboarded_pages=2,
    )
    assert m.get_and_reset_iteration_stats() == kv_api.CacheStats()


@pytest.mark.requires("host_tier")
def test_quota_resize_changes_a_later_pool_group_alone(backend: kv_api.Backend) -> None:
    """Two pool groups (slot sizes 256 and 128 KiB) split a host quota by ratio; a new quota
    may leave the first group's slot count as it is and change only the second's, which must
    still be resized (a loop that stopped at the first unchanged group would not)."""
    layers = [attention(0, 256 << 10), attention(1, 128 << 10, 8)]
    config = kv_api.KVCacheManagerConfig(
        tokens_per_block=4,
        cache_tiers=[kv_api.GpuCacheTierConfig(GRAIN), kv_api.HostCacheTierConfig(GRAIN)],
        layers=layers,
        initial_pool_ratio=[0.5, 0.5],
    )
    m = backend.KVCacheManager(config)
    before = [s.total for s in m.get_storage_statistics(1)]
    changed = None
    for quota in range(GRAIN - 32 * 4096, GRAIN + 64 * 4096, 4096):
        assert m.resize(1, quota)
        now = [s.total for s in m.get_storage_statistics(1)]
        if now[0] == before[0] and now[1] != before[1]:
            changed = quota
            break
        before = now
    assert changed is not None, "no quota changed the second group alone"
    assert m.get_quota(1) == changed


def test_quota_resize_refusals_read_alike(backends: list[kv_api.Backend]) -> None:
    """Every way ``resize(level, quota)`` refuses, with the class and message each backend gives
    (they must agree), and a quota of 1 byte: valid, below the minimum, so False."""
    seen = []
    for backend in backends:
        m = make_manager(backend)
        out: list[object] = []
        for args in ((0, 0), (0, "1"), (0, GRAIN, 1), (0, GRAIN, True), (1, GRAIN)):
            with pytest.raises(Exception) as info:
                m.resize(*args)
            out.append((type(info.value), str(info.value)))
        out.append(m.resize(0, 1))
        busy = [active(m, 4), active(m, 4)]
        with pytest.raises(InvalidStateError) as info:
            m.resize(0, GRAIN)
        out.append(str(info.value))
        assert "2 active" in str(info.value)
        for cache in busy:
            cache.close()
        seen.append(out)
    assert seen[0][5] is False
    assert all(s == seen[0] for s in seen)
