"""A publisher on loopback fed by a stand-in event manager, for the tests of the publisher's
sockets, threads and endpoints: they are the same whichever backend feeds it, so these tests need
none."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, cast

from kv_api import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, KVCacheEventManager, KVCacheManagerConfig
from kv_api.events import Created, KVCacheEvent
from kv_events import EventPublisher

CONFIG = KVCacheManagerConfig(
    tokens_per_block=4,
    cache_tiers=[GpuCacheTierConfig(2 << 20)],
    layers=[AttentionLayerConfig(0, [BufferConfig("key", 1 << 16), BufferConfig("value", 1 << 16)])],
)


class StubEvents:
    """The part of a ``KVCacheEventManager`` a publisher uses. Each ``flush_iteration_events``
    queues one event (a ``Created``: one wire event) for the next drain; ``hold`` makes the next
    flush wait until it is set (``entered`` tells it began); ``delay`` makes each flush take up to
    that long, at random (seconds: a real flush takes a while, releasing the GIL)."""

    def __init__(self, delay: float = 0.0) -> None:
        self._queued: list[KVCacheEvent] = []
        self._mutex = threading.Lock()
        self.hold: threading.Event | None = None
        self.entered = threading.Event()
        self.delay = delay

    @property
    def hash_algo(self) -> str:
        return "v2_sha256_64"

    def flush_iteration_events(self) -> None:
        hold, self.hold = self.hold, None
        self.entered.set()
        if hold is not None:
            assert hold.wait(10), "the held flush was never released"
        if self.delay:
            time.sleep(random.random() * self.delay)
        with self._mutex:
            self._queued.append(KVCacheEvent(len(self._queued), Created((1,)), None, "v2_sha256_64"))

    def get_latest_events(self, timeout_ms: float | None = 0) -> list[KVCacheEvent]:
        with self._mutex:
            out, self._queued = self._queued, []
        return out


def publisher(events: StubEvents | None = None, **kwargs: Any) -> EventPublisher:
    """A publisher on free loopback ports (replay included unless ``replay_endpoint=None``)."""
    kwargs.setdefault("endpoint", "tcp://127.0.0.1:*")
    kwargs.setdefault("replay_endpoint", "tcp://127.0.0.1:*")
    return EventPublisher(cast(KVCacheEventManager, events or StubEvents()), CONFIG, **kwargs)
