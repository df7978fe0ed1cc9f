"""Differential state machine over three tiers (device, host, disk): every backend under test,
driven in lock-step through random commits, closes, suspends, resumes and prefetches under
pressure, must agree after every step on per-level storage statistics, each cache's page
indices, page levels and ``cached_tokens_by_level``, bytes moved, counters and events. With a
single backend the invariants still run: levels in range, locked pages on the device, slot
accounting per level, and events that move each block from where it was.

A small budget (``TIER_EXAMPLES``, default 25 sequences of up to 40 steps); the suite's
hypothesis profile decides whether it is derandomized (``ci``: yes).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import kv_api
from kv_api import (
    AttentionLayerConfig,
    BufferConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
    KVCacheStatus,
)

from ._manager import check_indices, check_lengths
from ._tiers import Levels

EXAMPLES = int(os.environ.get("TIER_EXAMPLES") or 25)
SLOT = 128 * 1024  # key + value: the 2 MiB device tier has 16 slots
PREFIXES = [[(7 * i + 3) % 50 for i in range(40)], [(11 * i + 5) % 50 for i in range(40)]]
TOKEN = st.integers(0, 60)


def config_for(tpb: int, window: int | None, host_slots: int, path: str) -> KVCacheManagerConfig:
    kv = [BufferConfig("key", SLOT // 2), BufferConfig("value", SLOT // 2)]
    layers = [AttentionLayerConfig(0, kv)]
    if window is not None:
        layers.append(AttentionLayerConfig(1, kv, window))
    return KVCacheManagerConfig(
        tokens_per_block=tpb,
        cache_tiers=[
            GpuCacheTierConfig(2 << 20),
            HostCacheTierConfig(host_slots * SLOT),
            DiskCacheTierConfig(2 << 20, path),
        ],
        layers=layers,
    )


def make_machine(backends: list[kv_api.Backend]) -> type[RuleBasedStateMachine]:
    n = len(backends)

    class TierDifferential(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.caches: list[list[Any]] = []
            self.dirs = [tempfile.TemporaryDirectory(prefix="kv-tiers-") for _ in backends]

        @initialize(
            tpb=st.sampled_from([2, 4]),
            window=st.sampled_from([None, 8]),
            host_slots=st.sampled_from([2, 4, 7]),
        )
        def build(self, tpb: int, window: int | None, host_slots: int) -> None:
            self.tpb = tpb
            self.events = [b.KVCacheEventManager(100_000, "v2_sha256") for b in backends]
            self.managers = [
                b.KVCacheManager(config_for(tpb, window, host_slots, d.name), em)
                for b, em, d in zip(backends, self.events, self.dirs, strict=True)
            ]
            self.levels = [Levels() for _ in backends]
            self.groups = len(self.managers[0].life_cycles)

        def each(self, call: Callable[[int], tuple[Any, Any]]) -> list[Any] | None:
            kept: list[Any] = []
            seen: list[tuple[Any, ...]] = []
            for i in range(n):
                try:
                    value, compared = call(i)
                    kept.append(value)
                    seen.append(("ok", compared))
                except Exception as exc:  # noqa: BLE001 - the class and message are compared
                    seen.append(("raised", type(exc), str(exc)))
            for b, s in zip(backends[1:], seen[1:], strict=True):
                assert s == seen[0], f"{backends[0].name}: {seen[0]!r}\n{b.name}: {s!r}"
            return kept if seen[0][0] == "ok" else None

        def on_cache(self, index: int, call: Callable[[Any], Any]) -> None:
            caches = self.caches[index % len(self.caches)]
            self.each(lambda i: (None, call(caches[i])))

        @rule(prefix=st.sampled_from(range(len(PREFIXES))), length=st.integers(0, 40), tail=st.lists(TOKEN, max_size=4))
        def create(self, prefix: int, length: int, tail: list[int]) -> None:
            tokens = PREFIXES[prefix][:length] + tail

            def call(i: int) -> tuple[Any, Any]:
                cache = self.managers[i].create_kv_cache(None, tokens)
                return cache, (cache.num_committed_tokens, cache.cached_tokens_by_level)

            created = self.each(call)
            if created is not None:
                self.caches.append(created)

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99))
        def resume(self, index: int) -> None:
            self.on_cache(index, lambda c: c.resume())

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99))
        def suspend(self, index: int) -> None:
            self.on_cache(index, lambda c: c.suspend())

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), level=st.integers(0, 3))
        def prefetch(self, index: int, level: int) -> None:
            self.on_cache(index, lambda c: c.prefetch(level))

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), grow=st.integers(-2, 12), advance=st.integers(0, 6))
        def resize(self, index: int, grow: int, advance: int) -> None:
            self.on_cache(index, lambda c: c.resize(max(0, c.capacity + grow), c.history_length + advance))

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), prefix=st.sampled_from(range(len(PREFIXES))), size=st.integers(1, 10))
        def prefill(self, index: int, prefix: int, size: int) -> None:
            def step(c: Any) -> Any:
                start = c.num_committed_tokens
                chunk = PREFIXES[prefix][start : start + size] or [1, 2, 3]
                if not c.resize(max(c.capacity, start + len(chunk))):
                    return False
                c.commit(chunk)
                return True

            self.on_cache(index, step)

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99))
        def close(self, index: int) -> None:
            self.on_cache(index, lambda c: c.close())

        @rule(prefix=st.sampled_from(range(len(PREFIXES))), length=st.integers(1, 40), distinct=st.integers(0, 30))
        def request(self, prefix: int, length: int, distinct: int) -> None:
            """A whole request: admit (reusing what it can), prefill, one decode step, close;
            ``distinct`` prompts push others' pages down the tiers."""
            tokens = [*PREFIXES[prefix][:length], 100 + distinct]

            def run(m: Any) -> Any:
                c = m.create_kv_cache(None, tokens)
                steps: list[Any] = [c.num_committed_tokens, c.cached_tokens_by_level, c.resume()]
                if steps[-1] and c.resize(len(tokens) + 1):
                    c.commit(tokens[c.num_committed_tokens :])
                    steps.append([tuple(c.get_page_levels(lg)) for lg in range(self.groups)])
                c.close()
                return steps

            self.each(lambda i: (None, run(self.managers[i])))

        @rule(prefix=st.sampled_from(range(len(PREFIXES))), length=st.integers(0, 40))
        def probe(self, prefix: int, length: int) -> None:
            tokens = PREFIXES[prefix][:length]
            self.each(lambda i: (None, self.managers[i].probe_reuse(None, tokens)))

        # -- observations and invariants ------------------------------------------------------

        @invariant()
        def backends_agree(self) -> None:
            if not hasattr(self, "managers"):
                return

            def observe(i: int) -> tuple[None, Any]:
                m = self.managers[i]
                em = self.events[i]
                em.flush_iteration_events()
                events = em.get_latest_events(0)
                self.levels[i].apply(events)
                caches = [
                    (
                        c[i].status,
                        c[i].num_committed_tokens,
                        c[i].history_length,
                        c[i].capacity,
                        c[i].cached_tokens_by_level,
                        *(tuple(c[i].get_base_page_indices(lg)) for lg in range(self.groups)),
                        *(tuple(c[i].get_page_levels(lg)) for lg in range(self.groups)),
                    )
                    for c in self.caches
                ]
                stats = [m.get_storage_statistics(level) for level in range(3)]
                return None, (caches, stats, m.get_committed_stats(), m.get_bytes_moved(), events)

            self.each(observe)

        @invariant()
        def levels_and_slots(self) -> None:
            if not hasattr(self, "managers"):
                return
            for i, m in enumerate(self.managers):
                for level in range(3):
                    for s in m.get_storage_statistics(level):
                        assert 0 <= s.free and 0 <= s.evictable and s.free + s.evictable <= s.total, (level, s)
                for per_backend in self.caches:
                    c = per_backend[i]
                    check_lengths(c)
                    check_indices(m, c)
                    if c.status != KVCacheStatus.CLOSED:
                        assert sum(c.cached_tokens_by_level) == c.num_reused_tokens
                    for lg in range(self.groups):
                        levels = list(c.get_page_levels(lg))
                        indices = list(c.get_base_page_indices(lg))
                        assert len(levels) == c.num_blocks
                        assert set(levels) <= {-1, 0, 1, 2}
                        # A locked page is on the device.
                        for lv, slot in zip(levels, indices, strict=True):
                            assert slot < 0 or lv == 0, (lg, levels, indices)

        def teardown(self) -> None:
            for per_backend in self.caches:
                for c in per_backend:
                    c.close()
            for m in getattr(self, "managers", []):
                m.shutdown()
            for d in self.dirs:
                d.cleanup()

    return TierDifferential


def test_tier_backends_agree(backends: list[kv_api.Backend]) -> None:
    lacking = [b.name for b in backends if not (b.capabilities.host_tier and b.capabilities.disk_tier)]
    if lacking:
        pytest.skip(f"backends without host and disk tiers: {', '.join(lacking)}")
    run_state_machine_as_test(
        make_machine(backends),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=40,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
