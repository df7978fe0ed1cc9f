"""The wire against its real consumer: NVIDIA Dynamo's standalone KV indexer (PyPI
``ai-dynamo-runtime``) subscribed to two kvcore instances. For random prompts, the indexer's
overlap per instance must equal that instance's ``probe_reuse`` rounded down to whole blocks:
after commits, after evictions under pressure, after ``clear_reusable_blocks``, and with a host
tier, after pages moved down and back up (where its any-tier match is what kvcore can reuse)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import kv_api
from kv_api import KVCacheManager

# The suite's optional extra (kv-conformance[events]): without it these tests are skipped.
pytest.importorskip("kv_events", reason="kv-events is not installed (pip install 'kv-conformance[events]')")
from kv_events import EventPublisher
from kv_events.indexer import DynamoIndexer, dynamo_missing

from ._events import commit, published, settle
from ._manager import make_config
from .tiers._helpers import tier_config, tier_params

TPB = 4
pytestmark = [
    pytest.mark.requires("wire_events"),
    pytest.mark.skipif(dynamo_missing() is not None, reason=f"{dynamo_missing()}: the real consumer"),
]

Instance = tuple[KVCacheManager, EventPublisher]


@pytest.fixture
def fleet(backend: kv_api.Backend) -> Iterator[tuple[list[Instance], DynamoIndexer]]:
    config = make_config(TPB, slots=24)
    instances = []
    try:
        for _ in range(2):
            manager, _events, pub = published(backend, config)
            instances.append((manager, pub))
        with DynamoIndexer({i + 1: pub.endpoint for i, (_, pub) in enumerate(instances)}, TPB) as indexer:
            for n, (_, pub) in enumerate(instances, 1):
                assert pub.wait_for_subscribers(1), f"the indexer did not subscribe to instance {n}"
            yield instances, indexer
    finally:
        for _, pub in instances:
            pub.close()


def prompts(rng: random.Random, count: int, bases: Sequence[list[int]]) -> list[list[int]]:
    """Prompts sharing prefixes of ``bases`` (cut at any token), then their own tokens."""
    out = []
    for _ in range(count):
        base = rng.choice(bases)
        cut = rng.randrange(len(base) + 1)
        out.append(base[:cut] + [rng.randrange(50_000, 60_000) for _ in range(rng.randrange(0, 3 * TPB))])
    return out


def check_agreement(instances: list[Instance], indexer: DynamoIndexer, queries: list[list[int]]) -> None:
    """Every query's overlap per instance, once the events have reached the indexer."""
    for _, pub in instances:
        pub.flush()
    expected = [
        {n: manager.probe_reuse(None, q) // TPB * TPB for n, (manager, _) in enumerate(instances, 1)} for q in queries
    ]

    def probe() -> tuple[bool, list[tuple[list[int], dict[int, int], dict[int, int]]]]:
        wrong = []
        for query, want in zip(queries, expected, strict=True):
            answer = indexer.query(query)
            got = {n: answer[n].any_tier if n in answer else 0 for n in want}
            if got != want:
                wrong.append((query, want, got))
        return not wrong, wrong[:3]

    settle("the indexer's overlap against probe_reuse (query, expected, got)", probe)


def test_overlap_matches_probe_reuse_through_commits_and_evictions(
    fleet: tuple[list[Instance], DynamoIndexer],
) -> None:
    instances, indexer = fleet
    rng = random.Random(13)
    bases = [
        [rng.randrange(0, 50_000) for _ in range(rng.randrange(2, 7) * TPB + rng.randrange(TPB))] for _ in range(6)
    ]
    for _round in range(4):  # 24 slots each: later rounds evict earlier prefixes
        for manager, _ in instances:
            for tokens in prompts(rng, 4, bases):
                commit(manager, tokens)
        check_agreement(instances, indexer, prompts(rng, 12, bases) + bases)
    assert any(indexer.query(b) for b in bases), "nothing cached: the test checked only zeros"
    instances[0][0].clear_reusable_blocks()
    check_agreement(instances, indexer, bases)
    assert all(1 not in indexer.query(b) for b in bases)


@pytest.mark.parametrize("tiers", tier_params("host"))
def test_overlap_follows_tier_moves(backend: kv_api.Backend, tiers: str, tmp_path: Path) -> None:
    # 8 device and 4 host slots: evicted pages move to the host, and back up when reused.
    config = tier_config(["host"], tmp_path)
    instances: list[Instance] = []
    try:
        for _ in range(2):
            manager, _events, pub = published(backend, config)
            instances.append((manager, pub))
        with DynamoIndexer({i + 1: pub.endpoint for i, (_, pub) in enumerate(instances)}, TPB) as indexer:
            for _, pub in instances:
                assert pub.wait_for_subscribers(1)
            rng = random.Random(7)
            bases = [[rng.randrange(0, 50_000) for _ in range(3 * TPB)] for _ in range(5)]
            moved = False
            for _round in range(3):
                for manager, _ in instances:
                    for tokens in rng.sample(bases, 3):
                        commit(manager, tokens)
                check_agreement(instances, indexer, bases)
                moved = moved or any(o.any_tier > o.device for b in bases for o in indexer.query(b).values())
            assert moved, "no block was on the host tier: the tier moves went unchecked"
    finally:
        for _, pub in instances:
            pub.close()


def test_overlap_matches_probe_reuse_after_the_ring_overflows(backend: kv_api.Backend) -> None:
    """A ring of 50 events, and engine steps of 100 requests each: every step's flush
    overflows it, whatever the publisher's drain. The resync reaches the indexer as
    ``AllBlocksCleared`` and the tree's chains, so its view still equals ``probe_reuse``."""
    config = make_config(TPB, slots=24)
    events = backend.KVCacheEventManager(50, "v2_sha256_64")
    manager = backend.KVCacheManager(config, events)
    pub = EventPublisher(events, config, "tcp://127.0.0.1:*")
    try:
        with DynamoIndexer({1: pub.endpoint}, TPB) as indexer:
            assert pub.wait_for_subscribers(1)
            rng = random.Random(29)
            bases = [[rng.randrange(0, 50_000) for _ in range(rng.randrange(2, 6) * TPB)] for _ in range(8)]
            for _round in range(2):
                dropped = events.dropped_events
                for tokens in prompts(rng, 100, bases):
                    commit(manager, tokens)
                events.flush_iteration_events()
                assert events.dropped_events > dropped
                check_agreement([(manager, pub)], indexer, prompts(rng, 12, bases) + bases)
            assert any(indexer.query(b) for b in bases), "nothing cached: the test checked only zeros"
    finally:
        pub.close()
