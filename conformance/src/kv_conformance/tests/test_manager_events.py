"""KV-cache events from a live manager (invariant 15, behaviour-spec §4): Created, Stored per
layer group and merged along a chain, Removed on eviction and flushed first, ids, hash forms
(v1 falling back from a digest block on), every event's fields, no duplicates on reuse, the
ring, the event manager's arguments (one manager each), and ``get_latest_events`` waits."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import kv_api
from kv_api import ReuseScope
from kv_api.events import Created, KVCacheEvent, Removed, Stored, StoredBlock, UniqueToken

from ._manager import (
    GRAIN,
    active,
    attention,
    committed,
    hybrid_config,
    make_config,
    make_manager,
    priority,
    raises_exactly,
    toks,
)

TPB = 4


def keys(scope: ReuseScope | None, tokens: list[int]) -> list[bytes]:
    """The block keys of ``tokens``, block 0 first (no root)."""
    raw = kv_api.keys.block_keys(TPB, scope, tokens)
    return [raw[i : i + 32] for i in range(32, len(raw), 32)]


def v1_hashes(scope: ReuseScope | None, tokens: list[int]) -> list[int]:
    out, parent = [], 0
    for start in range(0, len(tokens), TPB):
        parent = kv_api.keys.block_hash_v1(tokens[start : start + TPB], parent, scope)
        out.append(parent)
    return out


def hashes(algo: str, scope: ReuseScope | None, tokens: list[int]) -> list[Any]:
    if algo == "v2_sha256":
        return [k.hex() for k in keys(scope, tokens)]
    if algo == "v2_sha256_64":
        return [int.from_bytes(k[:8], "big") for k in keys(scope, tokens)]
    return v1_hashes(scope, tokens)


def drain(events: Any) -> list[KVCacheEvent]:
    events.flush_iteration_events()
    return list(events.get_latest_events(0))


def setup(backend: kv_api.Backend, config: Any = None, entries: int = 100, algo: str = "v2_sha256") -> tuple[Any, Any]:
    events = backend.KVCacheEventManager(entries, algo)
    manager = make_manager(backend, config if config is not None else make_config(TPB, slots=16), event_manager=events)
    return manager, events


def stored_chain(events: list[KVCacheEvent], layer_group: int) -> list[tuple[Any, StoredBlock]]:
    """``(parent hash, block)`` for every Stored block of a layer group, in event order."""
    out = []
    for e in events:
        if isinstance(e.data, Stored) and e.layer_group_id == layer_group:
            parent = e.data.parent_hash
            for block in e.data.blocks:
                out.append((parent, block))
                parent = block.block_hash
    return out


def test_created_first(backend: kv_api.Backend) -> None:
    manager, events = setup(backend)
    got = drain(events)
    assert len(got) == 1
    assert got[0].event_id == 0
    total = sum(pg.num_slots for pg in manager.pool_group_descs)
    assert got[0].data == Created((total,))
    assert drain(events) == []


def test_stored_blocks_merge_along_a_chain(backend: kv_api.Backend) -> None:
    manager, events = setup(backend)
    drain(events)
    cache = active(manager, 16)
    for start in range(0, 12, TPB):
        cache.commit(toks(TPB, start))
    got = drain(events)
    assert [type(e.data) for e in got] == [Stored]
    (event,) = got
    assert (event.layer_group_id, event.window_size, event.hash_algo) == (0, None, "v2_sha256")
    assert isinstance(event.data, Stored)
    assert event.data.parent_hash is None
    expected = hashes("v2_sha256", None, toks(12))
    assert [b.block_hash for b in event.data.blocks] == expected
    for i, block in enumerate(event.data.blocks):
        assert block.tokens == tuple(UniqueToken(t) for t in toks(TPB, i * TPB))
        assert (block.cache_level, block.priority) == (0, 35)
    # A later block continues the chain in a new event whose parent is the last block.
    cache.commit(toks(TPB, 12))
    (event,) = drain(events)
    assert isinstance(event.data, Stored)
    assert event.data.parent_hash == expected[-1]
    assert [b.block_hash for b in event.data.blocks] == hashes("v2_sha256", None, toks(16))[3:]
    cache.close()


def test_stored_per_layer_group(backend: kv_api.Backend) -> None:
    manager, events = setup(backend, hybrid_config(TPB, slots=16, window=8))
    drain(events)
    cache = active(manager, 13, callback=lambda o, lc: 40 + o)
    cache.commit(toks(12))
    got = drain(events)
    assert all(isinstance(e.data, Stored) for e in got)
    expected = hashes("v2_sha256", None, toks(12))
    for lg, window in ((0, None), (1, 8)):
        assert all(e.window_size == window for e in got if e.layer_group_id == lg)
        chain = stored_chain(got, lg)
        assert [b.block_hash for _, b in chain] == expected, lg
        assert [p for p, _ in chain] == [None, *expected[:-1]], lg
        assert [b.priority for _, b in chain] == [40, 41, 42], lg
    assert {e.layer_group_id for e in got} == {0, 1}
    cache.close()


@pytest.mark.parametrize("algo", ["v2_sha256", "v2_sha256_64", "v1_block_key"])
@pytest.mark.parametrize("scope", [None, ReuseScope(7, 11), ReuseScope(None, 123)])
def test_hash_forms(backend: kv_api.Backend, algo: str, scope: ReuseScope | None) -> None:
    manager, events = setup(backend, algo=algo)
    drain(events)
    committed(manager, toks(12, 1), scope=scope)
    got = drain(events)
    assert all(e.hash_algo == algo for e in got)
    chain = stored_chain(got, 0)
    expected = hashes(algo, scope, toks(12, 1))
    assert [b.block_hash for _, b in chain] == expected
    assert [p for p, _ in chain] == [None, *expected[:-1]]


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


def test_v1_golden_values(backend: kv_api.Backend) -> None:
    """behaviour-spec §4: [1, 2, 3, 4] then [5, 6], unsalted and with salt 123."""
    for scope, golden in (
        (None, [924206229973855, 6875034662206558884]),
        (ReuseScope(None, 123), [6280297290684427985, 18177682803760873588]),
    ):
        manager, events = setup(backend, algo="v1_block_key")
        committed(manager, [1, 2, 3, 4, 5, 6], scope=scope)
        chain = stored_chain(drain(events), 0)
        assert [b.block_hash for _, b in chain] == golden


def test_auto_is_v1(backend: kv_api.Backend) -> None:
    manager, events = setup(backend, algo="auto")
    committed(manager, toks(4, 1))
    got = drain(events)
    assert all(e.hash_algo == "v1_block_key" for e in got)
    assert [b.block_hash for _, b in stored_chain(got, 0)] == v1_hashes(None, toks(4, 1))


def test_no_duplicate_stored_on_reuse(backend: kv_api.Backend) -> None:
    manager, events = setup(backend)
    committed(manager, toks(8))
    drain(events)
    # Reusing the prefix and extending it announces only the new blocks.
    cache = active(manager, None, toks(8, 8), reuse=toks(8))
    cache.close()
    chain = stored_chain(drain(events), 0)
    expected = hashes("v2_sha256", None, toks(16))
    assert [b.block_hash for _, b in chain] == expected[2:]
    assert chain[0][0] == expected[1]
    # Committing the same tokens again from scratch announces nothing.
    committed(manager, toks(16))
    assert stored_chain(drain(events), 0) == []


def test_removed_on_eviction_and_flushed_first(backend: kv_api.Backend) -> None:
    manager, events = setup(backend, make_config(TPB, slots=8))
    committed(manager, toks(8), callback=priority(10))  # evicted first
    committed(manager, toks(4, 100))
    drain(events)
    cache = active(manager, 7 * TPB)  # one eviction: block 0 of the first chain, and its child
    cache.commit(toks(4, 200))
    got = drain(events)
    first = hashes("v2_sha256", None, toks(8))
    assert [type(e.data) for e in got] == [Removed, Stored]
    removed = got[0].data
    assert isinstance(removed, Removed)
    assert sorted(removed.block_hashes) == sorted(first)
    assert got[0].layer_group_id == 0
    assert got[0].event_id < got[1].event_id
    # Removed events are flushed even when nothing else follows.
    cache.close()
    big = active(manager, 8 * TPB)
    got = drain(events)
    assert [type(e.data) for e in got] == [Removed]
    assert isinstance(got[0].data, Removed)
    assert sorted(got[0].data.block_hashes) == sorted(
        hashes("v2_sha256", None, toks(4, 100)) + hashes("v2_sha256", None, toks(4, 200))
    )
    big.close()


def test_event_ids_increase_from_zero(backend: kv_api.Backend) -> None:
    manager, events = setup(backend, make_config(TPB, slots=8))
    got: list[KVCacheEvent] = []
    for i in range(10):  # ten one-block chains in eight slots: two are evicted
        committed(manager, toks(TPB, 100 * i))
        if i % 3 == 2:
            got += drain(events)
    got += drain(events)
    assert [e.event_id for e in got] == list(range(len(got)))
    kinds = [type(e.data) for e in got]
    assert (kinds.count(Created), kinds.count(Stored)) == (1, 10)
    assert kinds.count(Removed) >= 1


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


def test_nothing_published_before_flush(backend: kv_api.Backend) -> None:
    manager, events = setup(backend)
    committed(manager, toks(8))
    assert events.get_latest_events(0) == []
    events.flush_iteration_events()
    got = events.get_latest_events(0)
    assert [type(e.data) for e in got] == [Created, Stored]
    assert events.get_latest_events(0) == []  # drained


def test_a_full_ring_resyncs_instead_of_dropping_the_oldest(backend: kv_api.Backend) -> None:
    """Five events (Created, four Stored) for a ring of 3: all five dropped and counted, then
    Created and the tree's four chains in key order, with new ids (test_events_overflow.py)."""
    manager, events = setup(backend, entries=3)
    for i in range(4):  # four unrelated one-block chains: four Stored events that do not merge
        committed(manager, toks(TPB, 100 * (i + 1)))
    got = drain(events)
    assert events.dropped_events == 5
    assert [e.event_id for e in got] == [5, 6, 7, 8, 9]
    assert [type(e.data) for e in got] == [Created, Stored, Stored, Stored, Stored]
    keys = [kv_api.keys.block_keys(TPB, None, toks(TPB, 100 * (i + 1)))[32:] for i in range(4)]
    hashes = [b.block_hash for e in got[1:] if isinstance(e.data, Stored) for b in e.data.blocks]
    assert hashes == sorted(k.hex() for k in keys)


@pytest.mark.parametrize("entries", [0, -1])
def test_zero_capacity_publishes_nothing(backend: kv_api.Backend, entries: int) -> None:
    manager, events = setup(backend, entries=entries)
    committed(manager, toks(8))
    assert drain(events) == []


@pytest.mark.parametrize("algo", ["sha256", "V2_SHA256", "", "v1"])
def test_unknown_hash_algo(backend: kv_api.Backend, algo: str) -> None:
    error = raises_exactly(ValueError, lambda: backend.KVCacheEventManager(16, algo))
    # The reference's phrase, so code matching on it keeps working.
    assert str(error) == (
        f"hash_algo: Unsupported V2 KV cache event hash algorithm: {algo!r} "
        "(expected auto, v2_sha256, v2_sha256_64, v1_block_key)"
    )


@pytest.mark.parametrize(("entries", "algo"), [(16, None), (16, 1), ("16", "v2_sha256"), (True, "v2_sha256")])
def test_event_manager_argument_types(backend: kv_api.Backend, entries: Any, algo: Any) -> None:
    raises_exactly(TypeError, lambda: backend.KVCacheEventManager(entries, algo))


@pytest.mark.parametrize("algo", [3, None, b"v2_sha256"])
def test_a_hash_algo_that_is_no_str_is_named(backend: kv_api.Backend, algo: Any) -> None:
    err = raises_exactly(TypeError, lambda: backend.KVCacheEventManager(16, algo))
    assert str(err) == f"hash_algo: expected a str, got {type(algo).__name__}"


def test_an_event_manager_serves_one_manager(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(16)
    make_manager(backend, make_config(), events)
    err = raises_exactly(ValueError, lambda: make_manager(backend, make_config(), events))
    assert str(err) == "event_manager: already used by another KVCacheManager"


def test_clear_removes_everything(backend: kv_api.Backend) -> None:
    manager, events = setup(backend)
    committed(manager, toks(8))
    committed(manager, toks(4, 100), scope=ReuseScope(1, None))
    drain(events)
    manager.clear_reusable_blocks()
    got = drain(events)
    assert all(isinstance(e.data, Removed) for e in got)
    removed = [h for e in got if isinstance(e.data, Removed) for h in e.data.block_hashes]
    expected = hashes("v2_sha256", None, toks(8)) + hashes("v2_sha256", ReuseScope(1, None), toks(4, 100))
    assert sorted(removed) == sorted(expected)


def test_stored_again_after_removal(backend: kv_api.Backend) -> None:
    manager, events = setup(backend, make_config(TPB, slots=8))
    committed(manager, toks(4))
    active(manager, 8 * TPB).close()  # evicts it
    drain(events)
    committed(manager, toks(4))
    got = drain(events)
    assert [b.block_hash for _, b in stored_chain(got, 0)] == hashes("v2_sha256", None, toks(4))


def test_default_event_manager(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager()
    manager = make_manager(backend, event_manager=events)
    committed(manager, toks(4))
    got = drain(events)
    assert all(e.hash_algo == "v2_sha256" for e in got)
    assert [b.block_hash for _, b in stored_chain(got, 0)] == hashes("v2_sha256", None, toks(4))


def test_get_latest_events_waits_for_a_flush(backend: kv_api.Backend) -> None:
    manager, events = setup(backend)
    drain(events)
    start = time.monotonic()
    assert events.get_latest_events(30) == []
    assert time.monotonic() - start >= 0.02

    def publish() -> None:
        time.sleep(0.05)
        committed(manager, toks(4))
        events.flush_iteration_events()

    thread = threading.Thread(target=publish)
    thread.start()
    got = events.get_latest_events(10_000)
    thread.join()
    assert [type(e.data) for e in got] == [Stored]
    assert time.monotonic() - start < 5


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


@pytest.mark.parametrize("timeout_ms", [1, 0.5])
def test_a_short_timeout_waits_it_out_when_nothing_is_published(backend: kv_api.Backend, timeout_ms: float) -> None:
    """Any positive timeout, however short, is waited for (at least that long) when no event
    is there."""
    events = backend.KVCacheEventManager(16)
    events.get_latest_events()  # nothing published, no manager: empty
    start = time.monotonic()
    assert events.get_latest_events(timeout_ms) == []
    assert time.monotonic() - start >= timeout_ms / 1000
