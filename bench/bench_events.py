"""Events benchmark (docs/events.md): events per second through the publisher (mapped, encoded
and sent), a decode step with a publisher attached against without (native backend; the target
is <= 1.1x), and routing time per request of each router of a multi-instance replay.

A decode step is ``resize`` by one token and ``commit`` of one, in ``CACHES`` caches in turn; with
``tpb`` 16, one step in 16 completes a block, whose ``Stored`` event the publisher's thread sends.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import kv_api
from kv_api import AttentionLayerConfig, BufferConfig, GpuCacheTierConfig, KVCacheManagerConfig
from kv_events import EventPublisher, EventSubscriber

TPB = 16
CACHES = 8


def config(blocks: int) -> KVCacheManagerConfig:
    kv = [BufferConfig("key", 512), BufferConfig("value", 512)]
    return KVCacheManagerConfig(TPB, [GpuCacheTierConfig(max(2 << 20, blocks * 2048))], [AttentionLayerConfig(0, kv)])


def publish_rate(backend: kv_api.Backend, blocks: int) -> float:
    """Stored events per second from commit to the subscriber, one block per event."""
    cfg = config(blocks * 2)
    events = backend.KVCacheEventManager(blocks * 4, "v2_sha256_64")
    manager = backend.KVCacheManager(cfg, events)
    rng = np.random.default_rng(0)
    with EventPublisher(events, cfg, "tcp://127.0.0.1:*") as pub, EventSubscriber(pub.endpoint) as sub:
        assert pub.wait_for_subscribers(1)
        pub.flush()
        # Each prompt is one block, so each Stored event carries one block.
        prompts = [rng.integers(0, 1 << 30, TPB, dtype=np.int32) for _ in range(blocks)]
        start = time.perf_counter()
        for p in prompts:
            cache = manager.create_kv_cache(None, p)
            cache.resume()
            cache.resize(TPB)
            cache.commit(p)
            cache.close()
        end = pub.flush()
        received = 0
        while received < blocks:
            got = sub.receive(10_000)
            assert got is not None, "the subscriber lost batches"
            received += sum(len(getattr(e, "block_hashes", ())) for e in got[1].events)
            if got[0] == end - 1:
                break
        return blocks / (time.perf_counter() - start)


def decode_seconds(backend: kv_api.Backend, steps: int, publish: bool) -> float:
    """Seconds per decode step (all caches), with or without a publisher draining the events."""
    cfg = config(CACHES * (steps // TPB + 4))
    events = backend.KVCacheEventManager(1 << 16, "v2_sha256_64")
    manager = backend.KVCacheManager(cfg, events)
    pub = EventPublisher(events, cfg, "tcp://127.0.0.1:*") if publish else None
    caches: list[Any] = []
    for i in range(CACHES):
        cache = manager.create_kv_cache(None, [i])
        cache.resume()
        caches.append(cache)
    start = time.perf_counter()
    for s in range(steps):
        for c in caches:
            c.resize(c.capacity + 1)
            c.commit([s])
        if pub is None:
            events.flush_iteration_events()
            events.get_latest_events(0)  # without a publisher the engine drains them itself
        else:
            events.flush_iteration_events()
    seconds = (time.perf_counter() - start) / steps
    for c in caches:
        c.close()
    if pub is not None:
        pub.close()
    return seconds


def routing(backend: kv_api.Backend) -> dict[str, float]:
    from kv_replay.cluster import replay_cluster
    from kv_replay.model import model_config
    from kv_replay.workload import default_workload

    cfg = model_config("4", 32, 16 << 20, 256, True, None)
    requests = default_workload(0)[:120]
    out = {}
    for router in ("round-robin", "kv", "dynamo"):
        r = replay_cluster(backend, cfg, requests, instances=4, router=router, max_in_flight=16)
        out[router] = float(np.median(r.routing_seconds)) * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name in kv_api.available_backends():
        backend = kv_api.load_backend(name)
        rate = max(publish_rate(backend, args.blocks) for _ in range(2))
        print(f"{name}: {rate:,.0f} Stored events per second, commit to subscriber")
        pairs = [(decode_seconds(backend, args.steps, False), decode_seconds(backend, args.steps, True))]
        pairs += [(decode_seconds(backend, args.steps, False), decode_seconds(backend, args.steps, True))]
        for _ in range(args.repeat - 2):
            pairs.append((decode_seconds(backend, args.steps, False), decode_seconds(backend, args.steps, True)))
        without = min(p[0] for p in pairs)
        attached = min(p[1] for p in pairs)
        print(
            f"{name}: decode step ({CACHES} caches) {without * 1e6:,.1f} us without a publisher, "
            f"{attached * 1e6:,.1f} us with one: {attached / without:.2f}x"
        )
        medians = routing(backend)
        print(
            f"{name}: routing per request (median, 4 instances): "
            + ", ".join(f"{k} {v:,.1f} us" for k, v in medians.items())
        )


if __name__ == "__main__":
    main()
