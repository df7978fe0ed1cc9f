"""The routers of a multi-instance replay (``kvcore replay --instances N --router NAME``): each
picks the instance that admits a request.

- ``round-robin``: instances in turn, blind to the cache;
- ``kv``: an exact oracle, every instance's ``probe_reuse`` (the most reused tokens wins);
- ``dynamo``: NVIDIA Dynamo's KV indexer (``python -m dynamo.indexer``), fed every instance's
  events over the wire (``kv_events``), the longest overlap it reports wins.

Ties go to the least loaded instance (fewest open requests), then the lowest index. Before each
``dynamo`` decision the events so far are published and a barrier waits until the indexer has
applied them (a one-block marker per instance, stored then removed), so the indexer sees what the
oracle sees: the replay measures the router's knowledge, not its event lag.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from kv_api import KVCacheManager, ReuseScope

if TYPE_CHECKING:  # kv_events is needed only by the dynamo router
    from kv_events import EventPublisher

ROUTERS = ("round-robin", "kv", "dynamo")


class Instance(Protocol):
    manager: KVCacheManager

    @property
    def open_requests(self) -> int: ...


def _best(scores: Sequence[int], instances: Sequence[Instance]) -> int:
    """The highest score; ties to the least loaded, then the lowest index."""
    return min(range(len(scores)), key=lambda i: (-scores[i], instances[i].open_requests, i))


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, instances: Sequence[Instance], scope: ReuseScope | None, tokens: np.ndarray) -> int:
        pick = self._next % len(instances)
        self._next += 1
        return pick

    def close(self) -> None:
        pass


class KvOracle:
    name = "kv"

    def pick(self, instances: Sequence[Instance], scope: ReuseScope | None, tokens: np.ndarray) -> int:
        return _best([i.manager.probe_reuse(scope, tokens) for i in instances], instances)

    def close(self) -> None:
        pass


class DynamoRouter:
    """Publishers on every instance's event manager and the indexer subscribed to them."""

    name = "dynamo"

    def __init__(self, publishers: Sequence[EventPublisher], tokens_per_block: int, timeout: float = 30.0) -> None:
        from kv_events.indexer import DynamoIndexer

        self._publishers = list(publishers)
        self._tpb = tokens_per_block
        self._timeout = timeout
        self.indexer = DynamoIndexer({n: p.endpoint for n, p in enumerate(self._publishers, 1)}, tokens_per_block)
        for n, p in enumerate(self._publishers, 1):
            if not p.wait_for_subscribers(1, timeout):
                raise RuntimeError(f"dynamo.indexer did not subscribe to instance {n} within {timeout}s")
        self._rng = random.Random(0x5EED)

    def _barrier(self) -> None:
        from kv_events.wire import BlockRemoved, BlockStored

        # Fresh token ids no trace uses (above 2**31) each time: the marker matches no prompt, and
        # seeing it means the previous marker's removal was applied too.
        marker = [self._rng.randrange(2**31, 2**32 - 1) for _ in range(self._tpb)]
        hashes = [self._rng.getrandbits(64) for _ in self._publishers]
        for p, h in zip(self._publishers, hashes, strict=True):
            p.flush()
            p.send([BlockStored([h], None, list(marker), self._tpb, None, "GPU")])
        deadline = time.monotonic() + self._timeout
        while len(self.indexer.query(marker)) < len(self._publishers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"dynamo.indexer did not apply the events within {self._timeout}s")
            time.sleep(0.001)
        for p, h in zip(self._publishers, hashes, strict=True):
            p.send([BlockRemoved([h], "GPU")])

    def pick(self, instances: Sequence[Instance], scope: ReuseScope | None, tokens: np.ndarray) -> int:
        self._barrier()
        overlap = self.indexer.query([int(t) for t in tokens])
        return _best([overlap[n].any_tier if n in overlap else 0 for n in range(1, len(instances) + 1)], instances)

    def close(self) -> None:
        for p in self._publishers:
            p.close()
        self.indexer.close()
