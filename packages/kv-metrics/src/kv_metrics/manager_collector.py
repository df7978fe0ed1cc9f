"""Managers' statistics as Prometheus metric families, read when a scrape asks (docs/metrics.md).

Nothing is counted on the engine's path: ``collect`` asks each watched manager for its committed
statistics, its levels' slot counts and the bytes it moved (calls that take the manager's lock
for a moment, from the scraping thread), and the block store for its own counters. The prefix
cache's queries, hits and usage carry vLLM's metric names, so dashboards built for vLLM read a
kvcore engine as they are; the rest is ``kvcore_``. Every sample is labelled ``model_name`` and
``engine`` (as vLLM's are), one value pair per watched manager.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from kv_api import CacheStats, KVCacheManager
from kv_api.errors import InvalidStateError

__all__ = ["RESUME_BUCKETS", "ManagerCollector"]

LABELS = ("model_name", "engine")
#: ``CacheStats`` fields as counters: (metric name, field, help).
COUNTERS = (
    ("vllm:prefix_cache_queries", "lookup_tokens", "Prefix cache queries, in tokens: the prompts of created caches."),
    ("vllm:prefix_cache_hits", "reused_tokens", "Prefix cache hits, in tokens: prompt tokens reused from the cache."),
    ("kvcore_requests", "requests", "KV caches created (requests admitted)."),
    ("kvcore_allocated_pages", "allocated_pages", "Pages handed out to caches."),
    ("kvcore_evicted_pages", "evicted_pages", "Pages evicted from the device level (moved down or dropped)."),
    ("kvcore_onboarded_pages", "onboarded_pages", "Pages moved up to the device level."),
    ("kvcore_committed_blocks", "committed_blocks", "Blocks that entered the prefix tree."),
    ("kvcore_corrupt_pages", "corrupt_pages", "Pages read back from disk that failed their checksum (never served)."),
    ("kvcore_disk_full_events", "disk_full_events", "Times the disk tier's file system had no room."),
    ("kvcore_remote_lookups", "remote_lookups", "Matches that asked the remote store."),
    ("kvcore_remote_blocks", "remote_blocks", "Blocks the remote store returned that entered the tree."),
    ("kvcore_remote_rejected", "remote_rejected", "Remote values that failed their checks (never used)."),
    ("kvcore_remote_written", "remote_written", "Committed blocks handed to the remote store."),
    ("kvcore_remote_errors", "remote_errors", "Remote store calls that failed (each a miss or a write not made)."),
    ("kvcore_remote_skipped", "remote_skipped", "Committed blocks not handed over while the store asked for a pause."),
)
#: Why prompt tokens were not reused (``CacheStats.miss_<reason>_tokens``; docs/manager.md, "Why a
#: prompt missed"): with the hits they add up to the queries.
MISS_REASONS = ("stale", "capped", "evicted", "partial", "never_seen", "other_scope")
#: The block store's own counters (``kv_store.StoreStats``), where it keeps them.
STORE_COUNTERS = (
    ("kvcore_store_hits", "hits", "Blocks the store returned."),
    ("kvcore_store_bad_values", "bad_values", "Values the store refused (wrong length, unreadable)."),
    ("kvcore_store_written", "written", "Blocks the store wrote."),
    ("kvcore_store_dropped", "dropped", "Blocks the store did not write (queue full, down, failed)."),
    ("kvcore_store_errors", "errors", "Failed store operations."),
    ("kvcore_store_read_bytes", "bytes_read", "Value bytes read from the store."),
    ("kvcore_store_written_bytes", "bytes_written", "Value bytes written to the store."),
)
#: Upper bounds (seconds) of the resume latency histogram's buckets: 10 µs to 1 s.
RESUME_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
#: The store call latency histogram's, as ``kv_store.CALL_BUCKETS`` (kv_metrics does not need
#: kv_store installed).
STORE_CALL_BUCKETS = RESUME_BUCKETS


@dataclasses.dataclass
class _Watched:
    manager: KVCacheManager
    labels: tuple[str, str]
    store: Any  # the remote tier's block store, or None
    levels: list[str]


@dataclasses.dataclass
class _Histogram:
    """Cumulative bucket counts as Prometheus keeps them, and the sum."""

    counts: list[int] = dataclasses.field(default_factory=lambda: [0] * len(RESUME_BUCKETS))
    total: int = 0
    sum: float = 0.0


def level_names(manager: KVCacheManager) -> list[str]:
    """``device``, ``host``, ``disk`` per local level of ``manager``'s config."""
    return [tier.tier.level_name for tier in manager.init_config.local_tiers]


class ManagerCollector:
    """A ``prometheus_client`` collector of the managers it watches (register it with a
    ``CollectorRegistry``). ``model_name`` labels every sample."""

    def __init__(self, model_name: str = "kvcore") -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self._watched: list[_Watched] = []
        self._resumes: dict[tuple[str, str, str], _Histogram] = {}

    def watch(self, manager: KVCacheManager, engine: str = "0") -> None:
        """Report ``manager`` under the label ``engine`` (unique among the watched) until
        ``forget``; its remote tier's store too, where it counts (``stats()``)."""
        remote = manager.init_config.remote_tier
        store = remote.store if remote is not None and callable(getattr(remote.store, "stats", None)) else None
        with self._lock:
            if any(w.labels[1] == engine for w in self._watched):
                raise ValueError(f"engine {engine!r} is watched already")
            self._watched.append(_Watched(manager, (self.model_name, engine), store, level_names(manager)))

    def forget(self, manager: KVCacheManager) -> None:
        """Stop reporting ``manager`` (before it shuts down: a shut-down manager answers nothing)."""
        with self._lock:
            self._watched = [w for w in self._watched if w.manager is not manager]

    def observe_resume(self, seconds: float, onboarding: bool, engine: str = "0") -> None:
        """One ``resume`` call's latency, as the engine timed it: ``onboarding`` where it brought
        pages up from a colder level."""
        key = (self.model_name, engine, "true" if onboarding else "false")
        with self._lock:
            histogram = self._resumes.setdefault(key, _Histogram())
            for i in range(bisect.bisect_left(RESUME_BUCKETS, seconds), len(RESUME_BUCKETS)):
                histogram.counts[i] += 1
            histogram.total += 1
            histogram.sum += seconds

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            watched = list(self._watched)
            resumes = {key: dataclasses.replace(h, counts=list(h.counts)) for key, h in self._resumes.items()}
        readings = [(w, r) for w in watched if (r := _read(w)) is not None]  # shut down meanwhile: left out
        yield from _counters(readings)
        yield _misses(readings)
        yield from _usage(readings)
        yield from _bytes_moved(readings)
        yield from _store(readings)
        yield _resume_histogram(resumes)


def _read(w: _Watched) -> tuple[CacheStats, list[list[Any]], dict[tuple[int, int], int], Any] | None:
    try:
        stats = w.manager.get_committed_stats()
        slots = [w.manager.get_storage_statistics(level) for level in range(len(w.levels))]
        moved = w.manager.get_bytes_moved()
    except InvalidStateError:  # shut down between watch and scrape: not this scrape's error
        return None
    store = w.store.stats() if w.store is not None else None
    return stats, slots, moved, store


_Reading = tuple[_Watched, tuple[CacheStats, list[list[Any]], dict[tuple[int, int], int], Any]]


def _counters(readings: Sequence[_Reading]) -> Iterator[Metric]:
    for name, field, text in COUNTERS:
        family = CounterMetricFamily(name, text, labels=LABELS)
        for w, (stats, _, _, _) in readings:
            family.add_metric(w.labels, getattr(stats, field))
        yield family


def _misses(readings: Sequence[_Reading]) -> Metric:
    family = CounterMetricFamily(
        "kvcore_prefix_cache_misses",
        "Prefix cache misses, in tokens, by reason: prompt tokens not reused (with the hits, the queries).",
        labels=[*LABELS, "reason"],
    )
    for w, (stats, _, _, _) in readings:
        for reason in MISS_REASONS:
            family.add_metric([*w.labels, reason], getattr(stats, f"miss_{reason}_tokens"))
    return family


def _usage(readings: Sequence[_Reading]) -> Iterator[Metric]:
    """The device level's usage under vLLM's name; every level's, and its slots by state."""
    vllm = GaugeMetricFamily(
        "vllm:kv_cache_usage_perc", "Device KV cache usage: 1 is full (cached evictable pages count as free).",
        labels=LABELS,
    )  # fmt: skip
    ratio = GaugeMetricFamily(
        "kvcore_cache_usage_ratio",
        "Share of a level's slots in use (not free, not evictable).",
        labels=[*LABELS, "level"],
    )
    slots = GaugeMetricFamily("kvcore_cache_slots", "A level's slots, by state.", labels=[*LABELS, "level", "state"])
    for w, (_, by_level, _, _) in readings:
        for level, groups in enumerate(by_level):
            total = sum(g.total for g in groups)
            free = sum(g.free for g in groups)
            evictable = sum(g.evictable for g in groups)
            used = (total - free - evictable) / total if total else 0.0
            if level == 0:
                vllm.add_metric(w.labels, used)
            name = w.levels[level]
            ratio.add_metric([*w.labels, name], used)
            for state, count in (("free", free), ("evictable", evictable), ("used", total - free - evictable)):
                slots.add_metric([*w.labels, name, state], count)
    yield from (vllm, ratio, slots)


def _bytes_moved(readings: Sequence[_Reading]) -> Iterator[Metric]:
    family = CounterMetricFamily(
        "kvcore_moved_bytes", "Page bytes copied between levels, by direction.", labels=[*LABELS, "src", "dst"]
    )
    for w, (_, _, moved, _) in readings:
        names = [*w.levels, "remote"]  # the remote tier's staging is the level after the local ones
        for (src, dst), count in sorted(moved.items()):
            family.add_metric([*w.labels, names[min(src, len(names) - 1)], names[min(dst, len(names) - 1)]], count)
    yield family


def _store(readings: Sequence[_Reading]) -> Iterator[Metric]:
    stored = [(w, store) for w, (_, _, _, store) in readings if store is not None]
    if not stored:
        return
    for name, field, text in STORE_COUNTERS:
        family = CounterMetricFamily(name, text, labels=LABELS)
        for w, store in stored:
            family.add_metric(w.labels, getattr(store, field))
        yield family
    calls = HistogramMetricFamily(
        "kvcore_store_call_seconds", "Latency of the store's contains/get_into/put calls.", labels=LABELS
    )
    for w, store in stored:
        calls.add_metric(w.labels, _cumulated(store), sum_value=store.call_seconds)
    yield calls


def _cumulated(store: Any) -> list[tuple[str, float]]:
    """A store's call latency buckets as Prometheus's cumulative ones (``kv_store.CALL_BUCKETS``);
    a store that keeps none (its own ``stats()``) gives only the count, under ``+Inf``."""
    counts = list(getattr(store, "call_buckets", ()))
    if len(counts) != len(STORE_CALL_BUCKETS) + 1:
        return [("+Inf", store.calls)]
    cumulated = list(itertools.accumulate(counts))
    return [(repr(float(b)), n) for b, n in zip(STORE_CALL_BUCKETS, cumulated, strict=False)] + [
        ("+Inf", cumulated[-1])
    ]


def _resume_histogram(resumes: dict[tuple[str, str, str], _Histogram]) -> Metric:
    family = HistogramMetricFamily(
        "kvcore_resume_seconds", "Latency of resume calls, as the engine timed them.", labels=[*LABELS, "onboarding"]
    )
    for key, h in sorted(resumes.items()):
        buckets = [(repr(float(bound)), count) for bound, count in zip(RESUME_BUCKETS, h.counts, strict=True)]
        family.add_metric(list(key), [*buckets, ("+Inf", h.total)], sum_value=h.sum)
    return family
