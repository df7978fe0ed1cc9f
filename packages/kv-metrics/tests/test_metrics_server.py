"""The exporter scraped over real HTTP, its values checked against the managers' own statistics,
on every backend under test (the conformance plugin's ``backend`` fixture: ``KV_BACKEND``)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
    RemoteCacheTierConfig,
    ReuseScope,
)
from kv_metrics import ManagerCollector, MetricsServer
from kv_metrics.manager_collector import COUNTERS, MISS_REASONS, RESUME_BUCKETS, STORE_CALL_BUCKETS

TOKENS_PER_BLOCK = 16
PAGE_BYTES = 4096


def make_manager(backend: kv_api.Backend) -> kv_api.KVCacheManager:
    """A device level of 2 MiB (its grain; 512 slots) above a host level."""
    config = KVCacheManagerConfig(
        TOKENS_PER_BLOCK,
        [GpuCacheTierConfig(1 << 21), HostCacheTierConfig(1 << 22)],
        [AttentionLayerConfig(0, [BufferConfig("kv", PAGE_BYTES)])],
    )
    return kv_api.create_manager(config, backend=backend)


def run_prompts(manager: kv_api.KVCacheManager, prompts: list[list[int]]) -> None:
    for prompt in prompts:
        cache = manager.create_kv_cache(ReuseScope(), prompt)
        cache.resume()
        assert cache.resize(len(prompt))
        cache.commit(prompt[cache.num_committed_tokens :])
        cache.close()


def workload(manager: kv_api.KVCacheManager) -> None:
    """Prompts that overflow the device into the host level, then the first ones again (brought
    back up): every counter and direction has something."""
    prompts = [[p * 10_000 + t for t in range(TOKENS_PER_BLOCK * 100 + 5)] for p in range(8)]
    run_prompts(manager, prompts)
    run_prompts(manager, prompts[:2])


def scrape(server: MetricsServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(server.url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def labels(engine: str = "0", model: str = "kvcore", **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"engine": engine, "model_name": model, **more}.items()))


def test_scraped_values_are_the_managers_statistics(backend: kv_api.Backend) -> None:
    manager = make_manager(backend)
    with MetricsServer(0, model_name="tiny") as server:
        server.collector.watch(manager)
        workload(manager)
        samples = scrape(server)
        stats = manager.get_committed_stats()
        assert stats.evicted_pages > 0 and stats.onboarded_pages > 0 and stats.reused_tokens > 0
        for name, field, _ in COUNTERS:
            assert samples[f"{name}_total", labels(model="tiny")] == getattr(stats, field), name
        misses = {r: samples["kvcore_prefix_cache_misses_total", labels(model="tiny", reason=r)] for r in MISS_REASONS}
        assert misses == {r: getattr(stats, f"miss_{r}_tokens") for r in MISS_REASONS}
        assert misses["never_seen"] > 0 and misses["partial"] > 0
        hits, queries = (samples[f"vllm:prefix_cache_{n}_total", labels(model="tiny")] for n in ("hits", "queries"))
        assert hits + sum(misses.values()) == queries
        for level, name in enumerate(("device", "host")):
            groups = manager.get_storage_statistics(level)
            free, evictable = sum(g.free for g in groups), sum(g.evictable for g in groups)
            assert samples["kvcore_cache_slots", labels(model="tiny", level=name, state="free")] == free
            assert samples["kvcore_cache_slots", labels(model="tiny", level=name, state="evictable")] == evictable
        moved = manager.get_bytes_moved()
        assert moved[0, 1] > 0 and moved[1, 0] > 0
        assert samples["kvcore_moved_bytes_total", labels(model="tiny", src="device", dst="host")] == moved[0, 1]
        assert samples["kvcore_moved_bytes_total", labels(model="tiny", src="host", dst="device")] == moved[1, 0]
        # A cache holding pages: the device's usage under vLLM's name is its share of used slots.
        cache = manager.create_kv_cache(ReuseScope(), list(range(TOKENS_PER_BLOCK * 64)))
        cache.resume()
        assert cache.resize(TOKENS_PER_BLOCK * 64)
        device = manager.get_storage_statistics(0)
        used = sum(g.unavailable for g in device) / sum(g.total for g in device)
        assert used > 0
        assert scrape(server)["vllm:kv_cache_usage_perc", labels(model="tiny")] == pytest.approx(used)
        cache.close()
    manager.shutdown()


def test_engines_are_labelled_apart_and_forgotten(backend: kv_api.Backend) -> None:
    first, second = make_manager(backend), make_manager(backend)
    collector = ManagerCollector()
    with MetricsServer(0, collector=collector) as server:
        collector.watch(first, engine="0")
        collector.watch(second, engine="1")
        with pytest.raises(ValueError, match="engine '1' is watched already"):
            collector.watch(first, engine="1")
        run_prompts(second, [list(range(100))])
        samples = scrape(server)
        assert samples["kvcore_requests_total", labels("0")] == 0
        assert samples["kvcore_requests_total", labels("1")] == 1
        collector.forget(second)
        assert ("kvcore_requests_total", labels("1")) not in scrape(server)
        # A manager shut down while watched is left out of the scrape, which still answers.
        first.shutdown()
        assert ("kvcore_requests_total", labels("0")) not in scrape(server)
    second.shutdown()


def test_resume_histogram_is_cumulative() -> None:
    with MetricsServer(0) as server:
        for seconds in (2e-5, 2e-5, 5e-4, 2.0):
            server.collector.observe_resume(seconds, onboarding=True)
        server.collector.observe_resume(1e-5, onboarding=False)
        samples = scrape(server)
    on = labels(onboarding="true")

    def bucket(bound: float, key: tuple[tuple[str, str], ...] = on) -> Any:
        return samples["kvcore_resume_seconds_bucket", tuple(sorted((*key, ("le", str(bound)))))]

    assert bucket(1e-05) == 0 and bucket(3e-05) == 2 and bucket(0.001) == 3 and bucket(1.0) == 3
    assert samples["kvcore_resume_seconds_bucket", tuple(sorted((*on, ("le", "+Inf"))))] == 4
    assert samples["kvcore_resume_seconds_count", on] == 4
    assert samples["kvcore_resume_seconds_sum", on] == pytest.approx(2.00054)
    assert bucket(1e-05, labels(onboarding="false")) == 1  # an observation on a bound is inside it
    assert len(RESUME_BUCKETS) == 11


@pytest.mark.requires("remote_tier")
def test_store_call_latency_is_a_histogram_of_the_stores_calls(backend: kv_api.Backend, tmp_path: Path) -> None:
    """Two managers share a file store (the second reuses the first's prompt through it): the
    store's calls, as the store counts them, are the histogram's count, sum and buckets."""
    kv_store = pytest.importorskip("kv_store")
    assert kv_store.CALL_BUCKETS == STORE_CALL_BUCKETS
    store = kv_store.FileBlockStore(tmp_path)
    layers = [AttentionLayerConfig(0, [BufferConfig("kv", PAGE_BYTES)])]
    config = KVCacheManagerConfig(
        TOKENS_PER_BLOCK, [GpuCacheTierConfig(1 << 21), RemoteCacheTierConfig(store, "m")], layers
    )
    first, second = kv_api.create_manager(config, backend=backend), kv_api.create_manager(config, backend=backend)
    prompt = list(range(TOKENS_PER_BLOCK * 20))
    with MetricsServer(0) as server:
        server.collector.watch(second)
        run_prompts(first, [prompt])
        assert store.flush(10)
        run_prompts(second, [prompt])
        samples = scrape(server)
        stats = store.stats()
    assert second.get_committed_stats().remote_blocks == 20 and stats.hits == 20
    assert samples["kvcore_store_call_seconds_count", labels()] == stats.calls > 0
    assert samples["kvcore_store_call_seconds_sum", labels()] == pytest.approx(stats.call_seconds)
    cumulated = [samples["kvcore_store_call_seconds_bucket", labels(le=str(b))] for b in STORE_CALL_BUCKETS]
    assert cumulated == sorted(cumulated) and cumulated[-1] <= stats.calls
    assert samples["kvcore_store_call_seconds_bucket", labels(le="+Inf")] == stats.calls
    assert sum(stats.call_buckets) == stats.calls
    first.shutdown()
    second.shutdown()
    store.close()


def test_a_port_in_use_is_an_os_error_and_close_frees_the_port() -> None:
    with MetricsServer(0) as server:
        with pytest.raises(OSError):
            MetricsServer(server.port)
    with socket.socket() as s:  # closed: the port can be bound again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))
    server.close()  # twice: nothing happens
