"""Differential state machine: every backend under test, driven in lock-step through random
manager and cache calls under memory pressure, with one to three cache levels, must agree on
every observable after every step: results and exceptions, lengths, page indices and levels,
reuse, storage statistics of every level, stats, bytes moved and events. Invariants are checked
on each backend after every step as well.

Capabilities: a configuration option (a cold tier, SSM layers or ``commit_min_snapshot``,
scratch reuse) is drawn only if two backends under test have what it needs, and each sequence
compares the backends that have everything its configuration needs; so a backend without
tiers compares with the others on device-only configurations, and the others still compare
with tiers among themselves. A backend without ``batched_calls`` takes the batched rules' single
calls."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, seed, settings
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
    CacheTierConfig,
    DiskCacheTierConfig,
    GpuCacheTierConfig,
    HostCacheTierConfig,
    KVCacheManagerConfig,
    KVCacheStatus,
    RemoteCacheTierConfig,
    ReuseScope,
    SsmLayerConfig,
    SwaScratchReuseConfig,
)
from kv_api.errors import CorruptedError
from kv_conformance import gates

from ._manager import check_indices, check_lengths, check_page_levels, check_report
from ._store import RecordingStore

#: Sequences (examples) per run, split into shards of at most SHARD_SIZE that xdist spreads over
#: its workers; ``nox -s tests`` asks for 6,000 (noxfile.py), a plain pytest run for 200.
EXAMPLES = int(os.environ.get("KV_DIFFERENTIAL_EXAMPLES") or 200)
SHARD_SIZE = 500
SHARDS = max(1, -(-EXAMPLES // SHARD_SIZE))
#: The ``user_properties`` key a shard reports its count under; the plugin adds them up.
SEQUENCES_PROPERTY = "kv_differential_sequences"

SCOPES = [None, ReuseScope(1, None), ReuseScope(None, 0)]
# Tokens of a tail or a commit: mostly ids, sometimes a multimodal digest.
TOKEN = st.integers(0, 60) | st.sampled_from([bytes(range(32)), bytes(range(1, 33))])
PREFIXES = [[(7 * i + 3) % 50 for i in range(48)], [(11 * i + 5) % 50 for i in range(48)]]
PRIORITIES: dict[str, Callable[[int, Any], int] | None] = {
    "default": None,
    "by_ordinal": lambda ordinal, lc: min(100, 10 + 7 * ordinal),
    "by_life_cycle": lambda ordinal, lc: 20 if lc.window else 60,
    # The life cycle's own stale-range rule, at a history that grows with the ordinal.
    "by_stale_range": lambda ordinal, lc: 20 + 10 * min(6, lc.get_stale_range(2 * ordinal * lc.tokens_per_block)[1]),
}


#: Cache levels below the device: small, so pages fall through them and get dropped.
TIERS = ["device", "device", "host", "host+disk", "disk"]
#: Layer mixes (config_for's ``hybrid``): attention alone most often.
HYBRID = ["attention", "attention", "cms", "ssm"]
#: ``max_rewind_len`` of sliding-window scratch reuse (None: off).
REWINDS: list[int | None] = [None, None, 0, 2, 5]
#: A remote tier (a ``RecordingStore`` per backend, whose calls must agree) below the local levels.
REMOTES = [False, False, True]
SLOT = 128 << 10  # bytes of a slot with one life cycle (key + value)


def tier_needs(tiers: str) -> list[str]:
    return [f"{kind}_tier" for kind in ("host", "disk") if kind in tiers]


def hybrid_needs(hybrid: str) -> list[str]:
    return [] if hybrid == "attention" else ["ssm_layers"]  # commit_min_snapshot needs it too


def rewind_needs(rewind: int | None) -> list[str]:
    return [] if rewind is None else ["swa_scratch"]


def remote_needs(remote: bool) -> list[str]:
    return ["remote_tier"] if remote else []


def tiers_for(tiers: str, host_slots: int, path: str, store: RecordingStore | None = None) -> list[CacheTierConfig]:
    out: list[CacheTierConfig] = [GpuCacheTierConfig(2 << 20)]
    if "host" in tiers:
        out.append(HostCacheTierConfig(host_slots * SLOT))
    if "disk" in tiers:
        out.append(DiskCacheTierConfig(2 << 20, path))
    if store is not None:
        out.append(RemoteCacheTierConfig(store, "differential"))
    return out


def config_for(
    tpb: int,
    window: int | None,
    sinks: int | None,
    full: bool,
    backoff: int,
    partial: bool,
    tiers: list[CacheTierConfig] | None = None,
    hybrid: str = "attention",
    tuned: bool = False,
    rewind: int | None = None,
    report: str = "on",
) -> KVCacheManagerConfig:
    """``hybrid``: ``attention`` alone, with ``commit_min_snapshot`` (``cms``), or with an SSM
    layer too (``ssm``, whose state slots are a pool group of their own). ``tuned``: the window's
    slots are twice the size (a pool group of their own, which short requests want a good share
    of) and the device has 6 grains, so ``adjust()`` has grains to move between groups.
    ``rewind``: sliding-window scratch reuse with that ``max_rewind_len`` (None: off).
    ``report``: the reuse report ``off``, ``on``, with a ghost record of 2 keys (``ghost2``) or
    with other scopes (``other``)."""
    kv = [BufferConfig("key", 64 << 10), BufferConfig("value", 64 << 10)]
    window_kv = [BufferConfig("key", 128 << 10), BufferConfig("value", 128 << 10)] if tuned else kv
    # A zero sink count is valid without a window too (no sinks); a positive one goes to the window only.
    layers: list[AttentionLayerConfig | SsmLayerConfig] = (
        [AttentionLayerConfig(0, kv, None, 0 if sinks == 0 else None)] if full or window is None else []
    )
    if window is not None:
        layers.append(AttentionLayerConfig(1, window_kv, window, sinks))
    if hybrid == "ssm":
        layers.append(SsmLayerConfig(2, [BufferConfig("state", 96 << 10)]))
    # 2 MiB of 128 KiB slots: 16 slots the life cycles share (more if the floors need them), so
    # caches compete for pages and committed blocks get evicted.
    tiers = tiers or [GpuCacheTierConfig(2 << 20)]
    if tuned:
        tiers = [GpuCacheTierConfig(12 << 20), *tiers[1:]]
    return KVCacheManagerConfig(
        tokens_per_block=tpb,
        cache_tiers=tiers,
        layers=layers,
        reuse_match_backoff=backoff,
        enable_partial_reuse=partial,
        commit_min_snapshot=hybrid != "attention",
        swa_scratch_reuse=None if rewind is None else SwaScratchReuseConfig(rewind),
        reuse_report=report != "off",
        ghost_record_blocks=2 if report == "ghost2" else 65536,
        reuse_report_other_scope=report == "other",
        # An eager auto-tuner, with no clock in its answers: every close is sampled and counts.
        rebalance_min_sampled_kv_caches=2,
        rebalance_cooldown_secs=0,
        rebalance_target_ratio_update_interval=2,
        rebalance_ratio_threshold=1.1,
        rebalance_moving_average_decay=0.9,
    )


def make_machine(backends: list[kv_api.Backend], ran: list[int]) -> type[RuleBasedStateMachine]:
    """The machine class; ``ran[0]`` counts the machines (sequences) it builds."""
    # The options two backends share; with every backend capable, the lists themselves, so the
    # draws are what they were before capabilities gated them.
    tier_options = gates.shared_options(TIERS, tier_needs, backends)
    hybrid_options = gates.shared_options(HYBRID, hybrid_needs, backends)
    rewind_options = gates.shared_options(REWINDS, rewind_needs, backends)
    remote_options = gates.shared_options(REMOTES, remote_needs, backends)

    class Differential(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            ran[0] += 1
            self.caches: list[list[Any]] = []  # one entry per cache: its object on each backend
            self.handles: list[list[Any]] = []  # planned drops, likewise (None once released)

        @initialize(
            tpb=st.sampled_from([2, 4]),
            window=st.sampled_from([None, 4, 8]),
            sinks=st.sampled_from([None, 0, 2]),
            full=st.booleans(),
            backoff=st.sampled_from([0, 0, 1]),
            partial=st.booleans(),
            hash_algo=st.sampled_from(["v1_block_key", "v2_sha256", "v2_sha256_64"]),
            ring=st.sampled_from([100_000, 8]),
            tiers=st.sampled_from(tier_options),
            host_slots=st.sampled_from([2, 4, 8]),
            hybrid=st.sampled_from(hybrid_options),
            tuned=st.sampled_from([False, False, True]),
            rewind=st.sampled_from(rewind_options),
            remote=st.sampled_from(remote_options),
            report=st.sampled_from(["on", "off", "ghost2", "other"]),
        )
        def build(
            self,
            tpb: int,
            window: int | None,
            sinks: int | None,
            full: bool,
            backoff: int,
            partial: bool,
            hash_algo: str,
            ring: int,
            tiers: str,
            host_slots: int,
            hybrid: str,
            tuned: bool,
            rewind: int | None,
            remote: bool,
            report: str,
        ) -> None:
            # The backends this configuration runs on: two share each option, but maybe not all
            # of the options at once (then the draw is rejected, and not counted as a sequence).
            needs = [*tier_needs(tiers), *hybrid_needs(hybrid), *rewind_needs(rewind), *remote_needs(remote)]
            self.compared = gates.having(backends, needs)
            if len(self.compared) < 2:
                ran[0] -= 1
            assume(len(self.compared) >= 2)
            self.batches = ["batched_calls" in gates.declared(b) for b in self.compared]
            self.dirs = [tempfile.mkdtemp(prefix="kv-differential-") for _ in self.compared]
            self.stores = [RecordingStore() for _ in self.compared] if remote else []
            self.configs = [
                config_for(
                    tpb,
                    window,
                    sinks,
                    full,
                    backoff,
                    partial,
                    tiers_for(tiers, host_slots, d, self.stores[i] if remote else None),
                    hybrid,
                    tuned,
                    rewind,
                    report,
                )
                for i, d in enumerate(self.dirs)
            ]
            self.levels = len(self.configs[0].local_tiers)
            self.tpb = tpb
            self.events = [b.KVCacheEventManager(ring, hash_algo) for b in self.compared]
            self.managers = [
                b.KVCacheManager(config, em)
                for b, em, config in zip(self.compared, self.events, self.configs, strict=True)
            ]
            self.groups = len(self.managers[0].life_cycles)
            self.rewind = rewind

        def each(self, call: Callable[[int], tuple[Any, Any]]) -> list[Any] | None:
            """``call(i) -> (kept, compared)`` on every backend. The compared values, or the
            exceptions' classes and messages, must be equal; returns the kept values, or None if
            the call raised (everywhere)."""
            kept: list[Any] = []
            seen: list[tuple[Any, ...]] = []
            for i in range(len(self.compared)):
                try:
                    value, compared = call(i)
                    kept.append(value)
                    seen.append(("ok", compared))
                except Exception as exc:  # noqa: BLE001 - the class and message are compared
                    seen.append(("raised", type(exc), str(exc)))
            for b, s in zip(self.compared[1:], seen[1:], strict=True):
                assert s == seen[0], f"{self.compared[0].name}: {seen[0]!r}\n{b.name}: {s!r}"
            # A broken internal rule is a bug even when every backend breaks it alike.
            assert seen[0][:2] != ("raised", CorruptedError), f"every backend: {seen[0]!r}"
            return kept if seen[0][0] == "ok" else None

        def on_cache(self, index: int, call: Callable[[Any], Any]) -> None:
            caches = self.caches[index % len(self.caches)]
            self.each(lambda i: (None, call(caches[i])))

        # -- rules ------------------------------------------------------------------------------

        @rule(
            scope=st.sampled_from(range(len(SCOPES))),
            prefix=st.sampled_from(range(len(PREFIXES))),
            length=st.integers(0, 48),
            tail=st.lists(TOKEN, max_size=6),
            priority=st.sampled_from(sorted(PRIORITIES)),
        )
        def create(self, scope: int, prefix: int, length: int, tail: list[Any], priority: str) -> None:
            tokens = PREFIXES[prefix][:length] + tail

            def call(i: int) -> tuple[Any, Any]:
                cache = self.managers[i].create_kv_cache(SCOPES[scope], tokens, None, PRIORITIES[priority])
                return cache, (cache.num_committed_tokens, cache.status, cache.reuse_report)

            created = self.each(call)
            if created is not None:
                self.caches.append(created)

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99))
        def resume(self, index: int) -> None:
            self.on_cache(index, lambda c: c.resume())

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), level=st.integers(0, 3))
        def prefetch(self, index: int, level: int) -> None:
            self.on_cache(index, lambda c: c.prefetch(level))

        @rule(level=st.integers(0, 2), slots=st.integers(1, 40))
        def quota_resize(self, level: int, slots: int) -> None:
            """A level's quota changed (the caches suspended first, as the call requires)."""

            def call(i: int) -> tuple[None, Any]:
                for c in self.caches:
                    if c[i].status == KVCacheStatus.ACTIVE:
                        c[i].suspend()
                return None, self.managers[i].resize(level, slots * SLOT)

            self.each(call)

        @rule(suspend_all=st.booleans())
        def adjust(self, suspend_all: bool) -> None:
            """The auto-tuner re-splits the device: with every cache suspended first, or else
            (any cache active) the same InvalidStateError everywhere."""

            def call(i: int) -> tuple[None, Any]:
                if suspend_all:
                    for c in self.caches:
                        if c[i].status == KVCacheStatus.ACTIVE:
                            c[i].suspend()
                return None, (self.managers[i].need_adjustment, self.managers[i].adjust())

            self.each(call)

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99))
        def suspend(self, index: int) -> None:
            self.on_cache(index, lambda c: c.suspend())

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), grow=st.integers(-3, 12), advance=st.integers(-1, 8))
        def resize(self, index: int, grow: int, advance: int) -> None:
            self.on_cache(index, lambda c: c.resize(max(0, c.capacity + grow), max(0, c.history_length + advance)))

        @precondition(lambda self: self.caches and self.rewind is not None)
        @rule(index=st.integers(0, 99), grow=st.integers(0, 12), back=st.integers(0, 6), done=st.integers(0, 12))
        def scratch_step(self, index: int, grow: int, back: int, done: int) -> None:
            """A step with sliding-window scratch: grow the capacity with the history moved to
            ``back`` tokens before the old capacity (a rewind when that is below the committed
            end; the resize rule refuses more than ``max_rewind_len``), then commit ``done``
            tokens of it."""

            def step(c: Any) -> Any:
                cap = c.capacity
                if not c.resize(cap + grow, max(c.history_length, cap - back)):
                    return False
                room = c.capacity - c.num_committed_tokens
                c.commit(list(range(min(done, room))))
                return True

            self.on_cache(index, step)

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), on=st.booleans())
        def toggle_scratch(self, index: int, on: bool) -> None:
            def toggle(c: Any) -> None:
                c.enable_swa_scratch_reuse = on

            self.on_cache(index, toggle)

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), tokens=st.lists(TOKEN, max_size=10), is_end=st.booleans())
        def commit(self, index: int, tokens: list[Any], is_end: bool) -> None:
            self.on_cache(index, lambda c: c.commit(tokens, is_end))

        # Batched calls: on each backend either the batch or the same single calls one by one
        # (``batched`` picks which backends batch, of those with batched calls), so the backends'
        # agreement checks one against the other, partial failures included (a failing call ends
        # both).

        @precondition(lambda self: self.caches)
        @rule(
            indices=st.lists(st.integers(0, 99), max_size=6),
            grows=st.lists(st.integers(-3, 12), min_size=6, max_size=6),
            batched=st.integers(0, 3),
        )
        def resize_many(self, indices: list[int], grows: list[int], batched: int) -> None:
            picked = [self.caches[k % len(self.caches)] for k in indices]

            def call(i: int) -> tuple[None, Any]:
                caches = [c[i] for c in picked]
                caps = [max(0, c.capacity + g) for c, g in zip(caches, grows, strict=False)]
                if (batched >> (i % 2)) & 1 and self.batches[i]:
                    return None, self.managers[i].resize_many(caches, caps)
                return None, [c.resize(cap) for c, cap in zip(caches, caps, strict=True)]

            self.each(call)

        @precondition(lambda self: self.caches)
        @rule(
            indices=st.lists(st.integers(0, 99), max_size=6),
            tokens=st.lists(st.lists(TOKEN, max_size=4), min_size=6, max_size=6),
            is_end=st.booleans(),
            batched=st.integers(0, 3),
        )
        def commit_many(self, indices: list[int], tokens: list[list[Any]], is_end: bool, batched: int) -> None:
            if self.stores:  # a batch writes through in one put, single commits one each (docs/store.md)
                batched = 3 if batched else 0  # so both backends batch alike: their puts must agree
            picked = [self.caches[k % len(self.caches)] for k in indices]
            parts = tokens[: len(picked)]

            def call(i: int) -> tuple[None, Any]:
                caches = [c[i] for c in picked]
                if (batched >> (i % 2)) & 1 and self.batches[i]:
                    flat = [t for part in parts for t in part]
                    self.managers[i].commit_many(caches, flat, [len(p) for p in parts], is_end)
                else:
                    for c, part in zip(caches, parts, strict=True):
                        c.commit(part, is_end)
                return None, None

            self.each(call)

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), prefix=st.sampled_from(range(len(PREFIXES))), size=st.integers(1, 8))
        def prefill(self, index: int, prefix: int, size: int) -> None:
            """Grow to hold the next ``size`` prefix tokens and commit them, as an engine's chunked
            prefill does; caches stopping mid-block leave partial blocks that others extend."""

            def step(c: Any) -> Any:
                start = c.num_committed_tokens
                done = c.committed_tokens
                # A cache keeps to the prefix it follows, so caches meet on the same blocks.
                p = next((k for k, q in enumerate(PREFIXES) if done and q[:start] == done), prefix)
                chunk = PREFIXES[p][start : start + size] or [1, 2, 3]
                if not c.resize(max(c.capacity, start + len(chunk))):
                    return False
                c.commit(chunk)
                return True

            self.on_cache(index, step)

        @rule(
            scope=st.sampled_from(range(len(SCOPES))),
            prefix=st.sampled_from(range(len(PREFIXES))),
            length=st.integers(1, 24),
            behind=st.integers(1, 8),
        )
        def twins(self, scope: int, prefix: int, length: int, behind: int) -> None:
            """Two requests for one prompt admitted together, so neither reuses the other's
            blocks: the first prefills it and is preempted (suspended, holding its blocks); the
            second, left active ``behind`` tokens short, computes the same blocks again."""
            tokens = PREFIXES[prefix][:length]
            done = max(0, length - behind)

            def call(i: int) -> tuple[Any, Any]:
                first = self.managers[i].create_kv_cache(SCOPES[scope], [])
                second = self.managers[i].create_kv_cache(SCOPES[scope], [])
                steps = [first.resume()]
                if steps[0]:
                    steps.append(first.resize(length))
                    if steps[-1]:
                        first.commit(tokens)
                    first.suspend()
                steps.append(second.resume() and second.resize(done))
                if steps[-1]:
                    second.commit(tokens[:done])
                return (first, second), steps

            made = self.each(call)
            if made is not None:
                self.caches += [[pair[0] for pair in made], [pair[1] for pair in made]]

        @rule(
            scope=st.sampled_from(range(len(SCOPES))),
            prefix=st.sampled_from(range(len(PREFIXES))),
            length=st.integers(1, 48),
            priority=st.sampled_from(sorted(PRIORITIES)),
            echo=st.booleans(),
            ahead=st.booleans(),
        )
        def request(self, scope: int, prefix: int, length: int, priority: str, echo: bool, ahead: bool) -> None:
            """A whole request, as an engine runs it: admit, prefill, decode a few tokens, close.
            With ``echo`` it decodes the prefix's next tokens, so its partial tail is a prefix of
            the block a longer request commits (and the other way round). With ``ahead`` the
            admission raises history to the prompt's end before the commit, so window blocks
            already stale get no pages and are committed without them."""
            tokens = PREFIXES[prefix][:length]
            decoded = PREFIXES[prefix][length : length + 2] if echo else [61, 62]
            broken: list[str] = []

            def check(m: Any, c: Any) -> None:
                # Closed by the step's end, the request is checked as it goes; a failure is
                # collected, since each() takes one that every backend raises alike as agreement.
                try:
                    check_page_levels(m, c)
                except AssertionError as exc:
                    broken.append(f"request: {exc}")

            def run(m: Any) -> Any:
                c = m.create_kv_cache(SCOPES[scope], tokens, None, PRIORITIES[priority])
                steps = [c.num_committed_tokens, c.resume()]
                if steps[-1] and c.resize(len(tokens) + 2, len(tokens) if ahead else None):
                    c.commit(tokens[c.num_committed_tokens :])
                    check(m, c)
                    for t in decoded:
                        steps.append(c.resize(c.capacity + 1) and (c.commit([t]) is None))
                        check(m, c)
                    steps.append(tuple(c.get_base_page_indices(0)))
                c.close()
                return steps

            self.each(lambda i: (None, run(self.managers[i])))
            assert not broken, broken[0]

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99))
        def close(self, index: int) -> None:
            self.on_cache(index, lambda c: c.close())

        @precondition(lambda self: self.caches)
        @rule(index=st.integers(0, 99), how=st.sampled_from(["as is", "stop", "stop and close"]))
        def plan_drop(self, index: int, how: str) -> None:
            """``plan_committed_block_drop``, after ``stop_committing`` unless ``as is`` (then it
            may raise), closing the cache after unless it stays open (its pages held, so not
            dropped): the handles are kept to be dropped or released later."""
            caches = self.caches[index % len(self.caches)]

            def call(i: int) -> tuple[Any, Any]:
                if how != "as is":
                    caches[i].stop_committing()
                handle = caches[i].plan_committed_block_drop()
                if how == "stop and close":
                    caches[i].close()
                return handle, handle is None

            planned = self.each(call)
            if planned is not None and planned[0] is not None:
                self.handles.append(planned)

        @precondition(lambda self: self.handles)
        @rule(index=st.integers(0, 99), release=st.booleans())
        def drop_planned(self, index: int, release: bool) -> None:
            """``drop()`` a planned drop (again: LogicError), or release it (dropping it unless it
            was), as a collected handle is."""
            handles = self.handles[index % len(self.handles)]

            def call(i: int) -> tuple[None, Any]:
                if handles[i] is None:
                    return None, "released"
                if release:
                    handles[i] = None  # the last reference: released now
                    return None, "released"
                return None, handles[i].drop()

            self.each(call)

        @rule(
            scope=st.sampled_from(range(len(SCOPES))),
            prefix=st.sampled_from(range(len(PREFIXES))),
            length=st.integers(0, 48),
        )
        def probe(self, scope: int, prefix: int, length: int) -> None:
            tokens = PREFIXES[prefix][:length]
            self.each(
                lambda i: (
                    None,
                    (
                        self.managers[i].probe_reuse(SCOPES[scope], tokens),
                        self.managers[i].probe_first_new_block_key(SCOPES[scope], tokens),
                    ),
                )
            )

        @rule(share=st.sampled_from([1, 2]))
        def spill(self, share: int) -> None:
            """Memory pressure: a request of fresh tokens takes the device's free and evictable
            slots (all, or about half), so held pages fall to colder levels under open caches,
            then ends without committing."""

            def run(m: Any) -> Any:
                room = min(s.free + s.evictable for s in m.get_storage_statistics(0))
                c = m.create_kv_cache(None, [])
                took = c.resume() and c.resize(self.tpb * max(1, room // (share * self.groups)))
                c.close()
                return took

            self.each(lambda i: (None, run(self.managers[i])))

        @rule()
        def clear(self) -> None:
            self.each(lambda i: (None, self.managers[i].clear_reusable_blocks()))

        # -- observations and invariants --------------------------------------------------------------

        @invariant()
        def backends_agree(self) -> None:
            def observe(i: int) -> tuple[None, Any]:
                m = self.managers[i]
                em = self.events[i]
                em.flush_iteration_events()
                caches = [
                    (
                        c[i].status,
                        c[i].num_committed_tokens,
                        c[i].history_length,
                        c[i].capacity,
                        c[i].num_blocks,
                        c[i].cached_tokens_by_level,
                        *(tuple(c[i].get_base_page_indices(lg)) for lg in range(self.groups)),
                        *(tuple(c[i].get_page_levels(lg)) for lg in range(self.groups)),
                        *(c[i].get_ssm_block_base_index(lg) for lg in range(self.groups)),
                        c[i].has_scratch_slots,
                        c[i].enable_swa_scratch_reuse,
                        *(c[i].get_scratch_desc(lg) for lg in range(self.groups)),
                    )
                    for c in self.caches
                ]
                levels = [(m.get_quota(lv), m.get_storage_statistics(lv)) for lv in range(self.levels)]
                return None, (
                    caches,
                    levels,
                    m.need_adjustment,
                    m.get_committed_stats(),
                    m.get_bytes_moved(),
                    em.get_latest_events(0),
                    self.stores[i].calls if self.stores else [],  # the store calls since the last step
                )

            if hasattr(self, "managers"):
                self.each(observe)
                for store in self.stores:
                    store.calls.clear()

        @invariant()
        def lengths_and_slots(self) -> None:
            if not hasattr(self, "managers"):
                return
            for i, m in enumerate(self.managers):
                counts = m.get_committed_stats()
                missed = [getattr(counts, f.name) for f in fields(counts) if f.name.startswith("miss_")]
                if self.configs[i].reuse_report:  # excluded ids count in neither
                    assert counts.reused_tokens + sum(missed) == counts.lookup_tokens, counts
                else:
                    assert not any(missed), counts
                for lv in range(self.levels):
                    for stats in m.get_storage_statistics(lv):
                        assert 0 <= stats.free and 0 <= stats.evictable and stats.free + stats.evictable <= stats.total
                owner: dict[tuple[int, int], tuple[int, int]] = {}
                for k, per_backend in enumerate(self.caches):
                    c = per_backend[i]
                    check_lengths(c)
                    check_indices(m, c)
                    check_page_levels(m, c)  # locked pages on the device, unlocked ones commit-pending
                    assert sum(c.cached_tokens_by_level) == c.num_reused_tokens
                    check_report(c, self.tpb)
                    for lg in range(self.groups):
                        indices = list(c.get_base_page_indices(lg))
                        levels = list(c.get_page_levels(lg))
                        assert len(indices) == len(levels) == c.num_blocks
                        assert set(levels) <= {-1, *range(self.levels)}
                        if c.status != KVCacheStatus.ACTIVE:
                            assert set(indices) <= {-1}
                        for o, slot in enumerate(indices):
                            if slot < 0:
                                continue
                            committed = (o + 1) * self.tpb <= c.num_committed_tokens
                            other = owner.setdefault((lg, slot), (k, o))
                            if other != (k, o):
                                # Only a committed block's page may be shared, and only by caches
                                # that committed that block too.
                                ok, oo = other
                                peer = self.caches[ok][i]
                                assert committed and (oo + 1) * self.tpb <= peer.num_committed_tokens, (
                                    f"slot {slot} of layer group {lg} owned by caches {ok} and {k}"
                                )

        def teardown(self) -> None:
            if any(b.poison_reason() is not None for b in backends):
                self._drop_poisoned()
                return
            self.handles.clear()  # released (dropped) while their managers live
            for per_backend in self.caches:
                for c in per_backend:
                    c.close()
            for m in getattr(self, "managers", []):
                m.shutdown()
            for d in getattr(self, "dirs", []):
                assert os.listdir(d) == [], "shutdown leaves no disk file"
                shutil.rmtree(d, ignore_errors=True)

        def _drop_poisoned(self) -> None:
            """The step that broke a rule failed the example; drop everything and take the latch
            back, so that the examples hypothesis runs next (shrinking it to its shortest
            sequence) start on clean backends instead of all failing at ``build``."""
            self.handles.clear()
            self.caches.clear()
            self.managers = []
            self.events = []
            gc.collect()
            for b in backends:
                if b.poison_reason() is not None:
                    b.take_poison()
            for d in getattr(self, "dirs", []):
                shutil.rmtree(d, ignore_errors=True)

    return Differential


@pytest.mark.parametrize("shard", range(SHARDS))
def test_backends_agree(backends: list[kv_api.Backend], shard: int, request: pytest.FixtureRequest) -> None:
    if len(backends) < 2:
        pytest.skip("needs two backends (KV_BACKEND=all or a comma list)")
    ran = [0]
    machine = make_machine(backends, ran)
    if settings().derandomize:
        # Derandomized runs seed from the test's code, the same in every shard: give each its own.
        machine = seed(shard)(machine)
    # Many examples: each is cheap, and divergences hide in rare paths.
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=min(SHARD_SIZE, EXAMPLES - shard * SHARD_SIZE),
                stateful_step_count=50,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
    finally:
        request.node.user_properties.append((SEQUENCES_PROPERTY, ran[0]))
