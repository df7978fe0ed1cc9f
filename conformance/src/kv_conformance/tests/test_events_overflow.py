"""A ring of published events (``max_kv_event_entries`` of them, 1000 by default) that would
overflow loses nothing silently (docs/manager.md, "Events"): its events and the queued ones are
dropped and counted (``dropped_events``), and the ring then holds a resync, ``Created`` (on the
wire: ``AllBlocksCleared``) followed by one ``Stored`` per announced chain of the tree as it is
now. A consumer that applies what it drains knows exactly what the manager can reuse, however
far behind it fell; every backend sends the same events."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kv_api
from kv_api import KVCacheEventManager, KVCacheManager, KVCacheManagerConfig
from kv_api.events import Created, KVCacheEvent, Removed, Stored, Updated
from kv_conformance import gates

from ._events import commit
from ._manager import committed, make_config, make_manager, toks
from .tiers._helpers import block_hashes, tier_config

TPB = 4


class Announced:
    """What a consumer knows: the block hashes announced and not removed, per layer group."""

    def __init__(self) -> None:
        self.blocks: dict[int | None, set[Any]] = {}

    def apply(self, events: Sequence[KVCacheEvent]) -> None:
        for e in events:
            if isinstance(e.data, Created):
                self.blocks.clear()
            elif isinstance(e.data, Stored):
                self.blocks.setdefault(e.layer_group_id, set()).update(b.block_hash for b in e.data.blocks)
            elif isinstance(e.data, Removed):
                self.blocks.setdefault(e.layer_group_id, set()).difference_update(e.data.block_hashes)
            else:
                assert isinstance(e.data, Updated)

    def reusable(self, tokens: list[int]) -> int:
        """Whole blocks of ``tokens`` a router would think cached, in tokens."""
        known = self.blocks.get(0, set())
        n = 0
        for block_hash in block_hashes(tokens[: len(tokens) // TPB * TPB]):
            if block_hash not in known:
                break
            n += TPB
        return n


def workload(seed: int, count: int) -> tuple[list[list[int]], list[list[int]]]:
    """``count`` prompts sharing prefixes of a few bases (cut anywhere), and the bases."""
    rng = random.Random(seed)
    bases = [[rng.randrange(0, 50_000) for _ in range(rng.randrange(2, 6) * TPB)] for _ in range(8)]
    prompts = []
    for _ in range(count):
        base = rng.choice(bases)
        cut = rng.randrange(len(base) + 1)
        prompts.append(base[:cut] + [rng.randrange(50_000, 60_000) for _ in range(rng.randrange(0, 3 * TPB))])
    return prompts, bases


def run(
    backend: kv_api.Backend, ring: int, drain_every: int, config: Any = None
) -> tuple[KVCacheManager, KVCacheEventManager, list[KVCacheEvent], Announced, list[list[int]]]:
    """Commit the workload with a flush per request (an engine step), draining every
    ``drain_every`` requests into a consumer model."""
    events = backend.KVCacheEventManager(ring, "v2_sha256")
    manager = backend.KVCacheManager(config or make_config(TPB, slots=24), events)
    prompts, bases = workload(5, 60)
    consumer, seen = Announced(), []
    for i, tokens in enumerate(prompts, 1):
        commit(manager, tokens)
        events.flush_iteration_events()
        if i % drain_every == 0:
            drained = events.get_latest_events(0)
            consumer.apply(drained)
            seen.extend(drained)
    return manager, events, seen, consumer, prompts + bases


def test_an_overflowing_ring_resyncs_the_consumer(backend: kv_api.Backend) -> None:
    """A ring of 10 drained every 20 requests overflows again and again: each drain that
    follows an overflow starts with ``Created`` then only ``Stored``, and the consumer's view
    equals ``probe_reuse`` for every prompt after each drain."""
    manager, events, seen, consumer, queries = run(backend, ring=10, drain_every=20)
    assert events.dropped_events > 0
    created = [i for i, e in enumerate(seen) if isinstance(e.data, Created)]
    assert len(created) >= 2, "no overflow after the first drain: the resync went unchecked"
    for q in queries:
        assert consumer.reusable(q) == manager.probe_reuse(None, q) // TPB * TPB, q
    assert any(consumer.reusable(q) for q in queries), "nothing cached: the test checked only zeros"
    manager.shutdown()


def test_a_ring_that_keeps_up_drops_nothing(backend: kv_api.Backend) -> None:
    manager, events, seen, consumer, queries = run(backend, ring=1000, drain_every=20)
    assert events.dropped_events == 0
    assert [e for e in seen if isinstance(e.data, Created)] == seen[:1]  # the manager's own only
    for q in queries:
        assert consumer.reusable(q) == manager.probe_reuse(None, q) // TPB * TPB, q
    manager.shutdown()


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


def test_every_backend_resyncs_with_the_same_events(backends: list[kv_api.Backend], tmp_path: Path) -> None:
    """Same requests, same events, ids included: the resync walks the tree in key order. With a
    host tier, so that resynced blocks sit on two levels, among the backends that have one; where
    some lack it, every backend is compared without one too."""
    with_host = gates.having(backends, ["host_tier"])
    runs: list[tuple[list[kv_api.Backend], KVCacheManagerConfig | None]] = []
    if with_host:
        runs.append((with_host, tier_config(["host"], tmp_path)))
    if len(with_host) < len(backends):
        runs.append((backends, None))
    for group, config in runs:
        results = []
        for b in group:
            manager, events, seen, _, _ = run(b, ring=7, drain_every=9, config=config)
            results.append((b.name, seen, events.dropped_events))
            manager.shutdown()
        first = results[0]
        for other in results[1:]:
            assert other[1] == first[1], (first[0], other[0])
            assert other[2] == first[2]


def test_an_event_manager_whose_manager_is_gone_drops_the_oldest(backend: kv_api.Backend) -> None:
    """No tree to resync from: the ring keeps its newest events, the others counted."""
    events = backend.KVCacheEventManager(3, "v2_sha256")
    manager = backend.KVCacheManager(make_config(TPB, slots=24), events)
    for i in range(6):
        commit(manager, [1000 * (i + 1) + t for t in range(TPB)])
    manager.shutdown()
    del manager
    events.flush_iteration_events()
    kept = events.get_latest_events(0)
    # Created, six Stored and the shutdown's Removed: the newest three kept.
    assert len(kept) == 3 and events.dropped_events == 5
    assert [e.event_id for e in kept] == [5, 6, 7]
    assert isinstance(kept[-1].data, Removed) and len(kept[-1].data.block_hashes) == 6
