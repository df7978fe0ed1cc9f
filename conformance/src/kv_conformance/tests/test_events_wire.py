"""KV-cache events on the wire (docs/events.md), decoded with a plain SUB socket: sequence
numbers, every field of every event kind, the window layer group left out, the replay socket
(a subscriber that dropped out fetches the gap), clean shutdown, and endpoint errors."""

from __future__ import annotations

import time

import pytest

import kv_api

# The suite's optional extra (kv-conformance[events]): without it these tests are skipped.
pytest.importorskip("kv_events", reason="kv-events is not installed (pip install 'kv-conformance[events]')")
from kv_events import EventPublisher, EventSubscriber
from kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, WireEvent

from ._events import published, settle, wire_hashes
from ._manager import committed, hybrid_config, make_config, toks

pytestmark = pytest.mark.requires("wire_events")

TPB = 4


def receive_all(sub: EventSubscriber, until_seq: int, timeout_ms: int = 10_000) -> list[tuple[int, EventBatch]]:
    """Batches up to (not including) ``until_seq``, in order; fails if one does not come."""
    out: list[tuple[int, EventBatch]] = []
    while not out or out[-1][0] < until_seq - 1:
        got = sub.receive(timeout_ms)
        assert got is not None, f"no batch within {timeout_ms} ms after {[s for s, _ in out]}"
        out.append(got)
    return out


def events_of(batches: list[tuple[int, EventBatch]]) -> list[WireEvent]:
    return [e for _, b in batches for e in b.events]


def test_every_field_and_sequence_numbers(backend: kv_api.Backend) -> None:
    manager, _events, pub = published(backend, make_config(TPB, slots=4))
    with pub, EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, from_seq=0) as sub:
        assert pub.wait_for_subscribers(1)
        first = toks(10)  # two full blocks and a partial one
        before = time.time()
        committed(manager, first)
        end = pub.flush()
        batches = receive_all(sub, end)
        assert [s for s, _ in batches] == list(range(end))  # from 0, no gap (seq 0 may come by replay)
        assert sub.missed == []
        for _, batch in batches:
            assert batch.data_parallel_rank == 0
            assert before - 60 < batch.ts < time.time() + 1
        hashes = wire_hashes(TPB, first)
        assert (
            events_of(batches)
            == [
                AllBlocksCleared(),  # the manager's Created: it holds nothing
                BlockStored(hashes[:2], None, first[:8], TPB, None, "GPU"),  # the partial block is not published
            ]
        )
        # Four slots: a second prompt of four blocks evicts the first prompt's blocks.
        second = toks(16, 100)
        committed(manager, second)
        end2 = pub.flush()
        got = events_of(receive_all(sub, end2)[-(end2 - end) :])
        removed = [h for e in got if isinstance(e, BlockRemoved) for h in e.block_hashes]
        stored = [e for e in got if isinstance(e, BlockStored)]
        assert sorted(removed) == sorted(hashes[:2])  # the partial block's removal is not published
        assert all(e.medium == "GPU" for e in got if isinstance(e, BlockRemoved))
        h2 = wire_hashes(TPB, second)
        assert [h for e in stored for h in e.block_hashes] == h2
        assert stored[0].parent_block_hash is None
        assert [t for e in stored for t in e.token_ids] == second
        manager.clear_reusable_blocks()
        end3 = pub.flush()
        got = events_of(receive_all(sub, end3)[-(end3 - end2) :])
        assert sorted(h for e in got if isinstance(e, BlockRemoved) for h in e.block_hashes) == sorted(h2)


def test_v2_sha256_events_give_the_same_wire_hashes(backend: kv_api.Backend) -> None:
    manager, _events, pub = published(backend, make_config(TPB, slots=8), algo="v2_sha256", replay=True)
    with pub, EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, from_seq=0) as sub:
        tokens = toks(12, 7)
        committed(manager, tokens)
        stored = [e for e in events_of(receive_all(sub, pub.flush())) if isinstance(e, BlockStored)]
        assert [h for e in stored for h in e.block_hashes] == wire_hashes(TPB, tokens)


def test_v1_hashes_are_refused(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(100, "v1_block_key")
    with pytest.raises(ValueError, match="hash_algo 'v1_block_key'"):
        EventPublisher(events, make_config(TPB), "tcp://127.0.0.1:*")


def test_window_layer_group_is_not_published(backend: kv_api.Backend) -> None:
    config = hybrid_config(TPB, slots=32, window=8)
    manager, _events, pub = published(backend, config)
    with pub, EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, from_seq=0) as sub:
        tokens = toks(24)
        committed(manager, tokens)
        stored = [e for e in events_of(receive_all(sub, pub.flush())) if isinstance(e, BlockStored)]
        # Each block once (the full-attention group's), though both layer groups announce it.
        assert [h for e in stored for h in e.block_hashes] == wire_hashes(TPB, tokens)


def test_replay_fills_the_gap_of_a_subscriber_that_dropped_out(backend: kv_api.Backend) -> None:
    manager, _events, pub = published(backend, make_config(TPB, slots=64))
    with pub:
        with EventSubscriber(pub.endpoint) as early:
            assert pub.wait_for_subscribers(1)
            committed(manager, toks(8, 1000))
            seen = receive_all(early, pub.flush())[-1][0]
        settle("the early subscriber left", lambda: (pub.subscribers == 0, pub.subscribers))
        # Published while nobody listens: lost on the PUB socket, kept in the replay buffer.
        for i in range(3):
            committed(manager, toks(8, 2000 + 100 * i))
            pub.flush()
        with EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint) as late:
            assert pub.wait_for_subscribers(1)  # live subscribers only: the early one has gone
            # The first batch it sees is the next live one; one that resumes must ask for the rest.
            committed(manager, toks(8, 3000))
            end = pub.flush()
            got = receive_all(late, end)
            assert [s for s, _ in got] == [end - 1]
        settle("the late subscriber left", lambda: (pub.subscribers == 0, pub.subscribers))
        with EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, from_seq=seen + 1) as resumed:
            assert pub.wait_for_subscribers(1)
            committed(manager, toks(8, 4000))
            end2 = pub.flush()
            got = receive_all(resumed, end2)
            assert [s for s, _ in got] == list(range(seen + 1, end2))  # the gap, by replay, then live
            assert resumed.missed == []
            firsts = [e.token_ids[0] for e in events_of(got) if isinstance(e, BlockStored)]
            assert firsts == [2000, 2100, 2200, 3000, 4000]


def test_a_gap_without_replay_is_reported_missed(backend: kv_api.Backend) -> None:
    manager, _events, pub = published(backend, make_config(TPB, slots=64), replay=False)
    with pub:
        committed(manager, toks(8))
        lost = pub.flush()  # published before anyone subscribed
        assert lost >= 1
        with EventSubscriber(pub.endpoint, from_seq=0) as sub:
            assert pub.wait_for_subscribers(1)
            committed(manager, toks(8, 100))
            end = pub.flush()
            got = receive_all(sub, end)
            assert [s for s, _ in got] == [end - 1]
            assert sub.missed == [(0, end - 2)]


def test_close_publishes_the_final_batch_and_frees_the_endpoint(backend: kv_api.Backend) -> None:
    manager, events, pub = published(backend, make_config(TPB, slots=16))
    with EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, from_seq=0) as sub:
        assert pub.wait_for_subscribers(1)
        committed(manager, toks(8, 500))  # not flushed: close() must publish it
        start = time.monotonic()
        pub.close()
        assert time.monotonic() - start < 5, "close() hung"
        assert pub.closed
        got: list[WireEvent] = []
        while (batch := sub.receive(5000)) is not None:
            got.extend(batch[1].events)
            if any(isinstance(e, BlockStored) for e in got):
                break
        assert [e.token_ids for e in got if isinstance(e, BlockStored)] == [toks(8, 500)]
    pub.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        pub.flush()
    # The sockets are closed: the same endpoint binds again at once.
    again = EventPublisher(events, make_config(TPB, slots=16), pub.endpoint)
    again.close()


def test_bad_endpoint_is_a_value_error_naming_it(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(100, "v2_sha256_64")
    for endpoint in ("nonsense", "tcp://127.0.0.1:notaport", "bogus://x"):
        with pytest.raises(ValueError, match="endpoint") as info:
            EventPublisher(events, make_config(TPB), endpoint)
        assert endpoint in str(info.value) and "\n" not in str(info.value)


def test_busy_endpoint_is_an_os_error_naming_it(backend: kv_api.Backend) -> None:
    events = backend.KVCacheEventManager(100, "v2_sha256_64")
    with EventPublisher(events, make_config(TPB), "tcp://127.0.0.1:*") as first:
        other = backend.KVCacheEventManager(100, "v2_sha256_64")
        with pytest.raises(OSError, match="in use") as info:
            EventPublisher(other, make_config(TPB), first.endpoint)
        assert first.endpoint in str(info.value)
        with pytest.raises(OSError, match="in use"):
            EventPublisher(other, make_config(TPB), "tcp://127.0.0.1:*", replay_endpoint=first.endpoint)


def test_lora_id_comes_from_the_scope(backend: kv_api.Backend) -> None:
    """Each block carries its scope's LoRA adapter, in kvcore's events and on the wire; the salt
    stays off the wire (docs/events.md)."""
    events = backend.KVCacheEventManager(100, "v2_sha256_64")
    manager = backend.KVCacheManager(make_config(TPB, slots=8), events)
    committed(manager, toks(8), scope=kv_api.ReuseScope(lora_id=7, salt=3))
    committed(manager, toks(4, 50))
    events.flush_iteration_events()
    stored = [b for e in events.get_latest_events() if isinstance(e.data, kv_api.events.Stored) for b in e.data.blocks]
    assert [b.lora_id for b in stored] == [7, 7, None]
    manager2, _events, pub = published(backend, make_config(TPB, slots=8))
    with pub, EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, from_seq=0) as sub:
        assert pub.wait_for_subscribers(1)
        scope = kv_api.ReuseScope(lora_id=2**64 - 1, salt=3)
        committed(manager2, toks(8), scope=scope)
        got = [e for e in events_of(receive_all(sub, pub.flush())) if isinstance(e, BlockStored)]
        assert [(e.block_hashes, e.lora_id) for e in got] == [(wire_hashes(TPB, toks(8), scope), 2**64 - 1)]
