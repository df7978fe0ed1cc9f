"""The replay loop: requests flow through a manager the way an inference engine drives it.

Every step: the waiting request (admitted, but refused pages so far) is resumed if the manager
lets it; new requests are admitted first come, first served while fewer than ``max_in_flight``
run and none waits (``create_kv_cache`` with reuse, ``resume``, ``resize`` to the prompt, then the
prefill ``commit``); requests whose output is done close; then every running request decodes one
token, the way an engine runs an iteration: every cache is resized by one (room for the token the
forward pass writes), then every new token is committed. A resize that finds no page makes room:
the newest other open request is preempted (closed, its committed blocks left reusable) and
re-queued first, to be re-admitted with its prompt and the tokens generated so far. A request
that cannot start or decode while it is the only open cache never will, and is rejected. Every
decision depends only on what the manager returns, so two backends that behave identically
replay identically.

Batched decode: the resizes go as one ``resize_many`` and the commits as one ``commit_many`` (one
crossing each into a native backend); ``batched = False`` issues the same calls one cache at a
time, in the same order, with the same results (what a backend that does not declare
``batched_calls`` gets). ``run`` goes further: the steps that only decode (no request waits, none
can be admitted, up to the one in which a request generates its last token) go as one
``decode_steps``, which makes exactly those steps' ``resize_many`` and ``commit_many`` calls and
reads each step's pool statistics for its sample (``ahead = False`` steps one at a time; a
replay stepped from outside, as a cluster's, always does).

Events: with an event manager, every step ends with ``flush_iteration_events()``, as an engine's
iteration does, so a publisher sends each step's events (removals are buffered until then).

Termination: every step decodes a token, completes a request or rejects one (the oldest running
request either decodes or is left alone with the whole pool and then rejected), so a
replay ends within ``len(requests) + total output tokens`` steps; ``run`` raises rather than
loop if a step ever makes no progress.

A remote tier: before each admission the replay waits for the store's queued writes (a store's
``flush``, where it has one), as the time between an engine's requests lets them land; a replay
runs far faster than an engine, and a store's bounded queue would otherwise drop what a fleet
writes. The wait is not the manager's time.

Errors: the manager's failures on one cache level, building it or running (memory it cannot
map, a disk tier's files), are a ``kv_replay.tier_errors.TierError`` naming the level and field.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, count, groupby, islice
from typing import Any, TypeVar

import numpy as np

from kv_api import (
    Backend,
    KVCache,
    KVCacheEventManager,
    KVCacheManagerConfig,
    create_manager,
)
from kv_api.stats import EvictedBlock
from kv_replay import resident
from kv_replay.miss_report import misses_of
from kv_replay.prefix_report import first_block
from kv_replay.replay_result import REMOTE_COUNTERS, ReplayResult, RequestRecord, Sample, level_name
from kv_replay.stack_recorder import StackRecorder
from kv_replay.tier_errors import tier_errors
from kv_replay.trace import Request

_T = TypeVar("_T")
_now = time.perf_counter
#: The longest wait for a remote store's queued writes before an admission (a store that is down
#: drops them sooner: its calls time out).
_STORE_SETTLE_S = 10.0
#: The most steps one ``decode_steps`` call runs (its tokens are built in one list).
_AHEAD_LIMIT = 1024
# index, tokens (None: the request's prompt, read when admitted), generated, first
_Queued = tuple[int, "np.ndarray[Any, np.dtype[np.int32]] | None", int, bool]


@dataclass(eq=False)  # compared by identity: ``live in running`` must not compare every field
class _Live:
    index: int
    request: Request
    cache: KVCache
    tokens: np.ndarray[Any, np.dtype[np.int32]]  # prompt + tokens generated before a preemption
    generated: int  # output tokens generated before this admission
    first: bool  # not started yet: its reuse and latency are recorded when it starts
    started: float = 0.0  # when create_kv_cache was called
    output: list[int] = field(default_factory=list)  # the request's output tokens, as ints
    open: bool = True  # closed when it completes, is rejected or is preempted
    # The step it started running in, or -1. A running request decodes one token in every step
    # from then on (or leaves the running list), so its capacity and generated tokens follow from
    # the step number: the decode step reads no per-request state.
    step: int = -1
    remaining: Iterator[int] = field(default_factory=lambda: iter(()))  # output tokens not yet decoded, once running

    def generated_by(self, step: int) -> int:
        """Output tokens generated before the decode of ``step``."""
        return self.generated if self.step < 0 else self.generated + step - self.step


class Replayer:
    waiting: _Live | None  # admitted, suspended until the manager lets it start (set by begin())
    steps: int
    _view: _DecodeView | None

    def __init__(
        self,
        backend: Backend,
        config: KVCacheManagerConfig,
        max_in_flight: int,
        progress: Callable[[int, int], None] | None = None,
        event_manager: KVCacheEventManager | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.backend = backend
        resident.reset_peak()  # this replay's peak, not an earlier one's
        with tier_errors(config):  # a level it cannot build is a TierError naming it
            self.manager = create_manager(config, backend=backend, event_manager=event_manager)
        self.events = event_manager
        self.config = config
        self.tiered = len(config.cache_tiers) > 1  # the tier APIs are only asked for with tiers
        self.max_in_flight = max_in_flight
        self.progress = progress
        # The decode step's resizes and commits as one call each, where the backend has them; and
        # in run(), without events, the steps that only decode as one call.
        self.batched = backend.capabilities.batched_calls
        self.ahead = True  # run() decodes ahead where it may: batched, without events
        self._ahead_now = False
        remote = config.remote_tier
        self._settle_store = getattr(remote.store, "flush", None) if remote is not None else None
        # Told each resume's latency and whether it onboarded (kv_replay.metrics, --metrics-port).
        self.on_resume: Callable[[float, bool], None] | None = None
        # Told each start and close, for the stack distances of --quota-curve.
        self.recorder: StackRecorder | None = None

    # -- timed manager calls --------------------------------------------------------------------------

    def _timed(self, call: Callable[..., _T], *args: Any, hashed: int = 0) -> _T:
        start = _now()
        value = call(*args)
        self._count(start, hashed)
        return value

    def _count(self, start: float, hashed: int = 0) -> None:
        """A manager call that began at ``start`` (``perf_counter``) ended now, given ``hashed`` tokens."""
        seconds = _now() - start
        self.result.manager_seconds += seconds
        if hashed:
            self.result.hashed_tokens += hashed
            self.result.hashing_seconds += seconds

    # -- request life -------------------------------------------------------------------------------

    def _admit(self, entry: _Queued) -> _Live:
        index, queued, generated, first = entry
        request = self.requests[index]
        tokens = request.prompt if queued is None else queued  # a trace's prompt may be gathered now
        if self._settle_store is not None:
            self._settle_store(_STORE_SETTLE_S)
        self._created.append(request.seconds)
        start = _now()
        cache = self._timed(self.manager.create_kv_cache, request.scope, tokens, hashed=len(tokens))
        return _Live(index, request, cache, tokens, generated, first, start, output=request.output.tolist())

    def _start(self, live: _Live) -> bool:
        """Resume and size a suspended request, then prefill; False leaves it suspended."""
        cache = live.cache
        before = self.result.manager_seconds
        if not self._timed(cache.resume):
            return False
        resumed = self.result.manager_seconds - before
        onboarding = self.tiered and any(cache.cached_tokens_by_level[1:])
        (self.result.onboarding_resume_seconds if onboarding else self.result.other_resume_seconds).append(resumed)
        if self.on_resume is not None:
            self.on_resume(resumed, onboarding)
        if not self._timed(cache.resize, len(live.tokens)):
            self._timed(cache.suspend)
            return False
        if self.recorder is not None:
            self.recorder.started(id(live), live.request.scope, live.tokens, cache.num_committed_tokens, live.first)
        if live.first:  # the admission that runs: its reuse and latency are the request's
            live.first = False
            record = self.result.records[live.index]
            record.reused_tokens = cache.num_committed_tokens
            record.admission_seconds = _now() - live.started
            record.reused_by_level = list(cache.cached_tokens_by_level) if self.tiered else [cache.num_committed_tokens]
            record.step = self.steps
            report = cache.reuse_report
            if report is not None:
                record.misses = misses_of(report)
                self._count_evicted(report.evicted_blocks)
            self.admitted_prompt += live.request.prompt_length
            self.reused += cache.num_committed_tokens
        rest = live.tokens[cache.num_committed_tokens :]
        if len(rest):
            self._timed(cache.commit, rest, hashed=len(rest))
        return True

    def _decode(self) -> int:
        """One token for every running request; how many decoded.

        Every cache is resized by one, then every token is committed (one ``resize_many`` and one
        ``commit_many`` when ``batched``, else the same calls one cache at a time). A resize that
        finds no page changed nothing: in order, each such request makes room (``_make_room``)
        and tries again, before any commit.
        """
        view = self._decode_view()
        capacities = [base + self.steps for base in view.capacity_base]
        if self.batched:
            start = _now()  # not through _timed: the step's two calls are most of the calls
            resized = self.manager.resize_many(view.caches, capacities)
            self._count(start)
        else:
            resized = [self._timed(c.resize, n) for c, n in zip(view.caches, capacities, strict=True)]
        return self._decode_resized(view, resized, capacities)

    def _decode_view(self) -> _DecodeView:
        if self._view is None:
            self._view = _DecodeView(self.running)
        return self._view

    def _decode_resized(self, view: _DecodeView, resized: list[bool], capacities: list[int]) -> int:
        """The rest of the decode step once its resizes are made: room made where one failed,
        then the commits."""
        step = self.steps
        if all(resized):  # the usual step: no per-request work in Python
            caches, counts = view.caches, view.ones
            tokens = list(map(next, view.remaining))
        else:
            # Only newer requests make room, so one preempted here has not been reached yet.
            caches, tokens = [], []
            for live, ok, capacity in zip(list(self.running), resized, capacities, strict=True):
                if live.open and (ok or self._make_room(live, capacity)):
                    caches.append(live.cache)
                    tokens.append(next(live.remaining))
            counts = [1] * len(tokens)
        if self.batched:
            start = _now()
            self.manager.commit_many(caches, tokens, counts)
            self._count(start, len(tokens))
        else:
            for cache, token in zip(caches, tokens, strict=True):
                self._timed(cache.commit, [token], hashed=1)
        for live in self._ending.pop(step, ()):  # generated their last token now
            if live.open:
                self.complete.append(live)
        return len(tokens)

    def _steps_ahead(self) -> int:
        """How many steps from this one only decode, when none can admit a request (one waits,
        none is queued, or as many run as may): up to and including the next in which a request
        generates its last token (a completion follows)."""
        admitting = self.waiting is None and self.pending and len(self.running) < self.max_in_flight
        if not self._ahead_now or admitting:
            return 1
        step = self.steps
        last = min((k for k in self._ending if k >= step), default=step)
        return min(last - step + 1, _AHEAD_LIMIT)

    def _decode_ahead(self, n: int) -> list[bool] | None:
        """Steps ``self.steps`` to ``self.steps + n - 1`` through one ``decode_steps``, each
        sampled as ``step`` samples it. Where one's resizes did not all succeed, that step is
        left current with its resize results returned (else None). A waiting request's retry
        ends the run too: after the step that leaves some pool group more room than it had
        when the request last failed to start."""
        view = self._decode_view()
        step = self.steps
        # Step by step, each request's next token; its iterator moves on by the steps that ran.
        rows = []
        for live in self.running:
            first = live.generated_by(step)
            rows.append(live.output[first : first + n])
        tokens = list(chain.from_iterable(zip(*rows, strict=True)))
        totals = [s.total for s in self.manager.get_storage_statistics()]
        until_room = self._room_failed if self.waiting is not None else None
        start = _now()
        run = self.manager.decode_steps(view.caches, tokens, n, until_room)
        self._count(start, run.steps * len(view.caches))
        for step in range(self.steps, self.steps + run.steps):
            for live in self._ending.pop(step, ()):  # generated their last token now
                if live.open:
                    self.complete.append(live)
        self._samples(self.steps, totals, run.free, run.evictable)
        self.steps += run.steps
        if run.steps:
            for it in view.remaining:
                next(islice(it, run.steps - 1, None))
        return run.resized or None

    def _make_room(self, live: _Live, capacity: int) -> bool:
        """Preempt the newest other open request until ``live``'s resize to ``capacity`` finds
        room; False when ``live`` itself was preempted or rejected (alone with the whole pool)."""
        running = self.running
        while True:
            if self.waiting is not None:  # the newest open request holds pages too
                self._requeue(self.waiting)
                self.waiting = None
            else:
                victim = running.pop()  # the newest running request makes room
                self._view = None
                if victim is live and not running:  # alone with the whole pool: never fits
                    self._finish(live, rejected=True)
                    return False
                self.result.records[victim.index].preemptions += 1
                self._requeue(victim)
                if victim is live:
                    return False
            if self._timed(live.cache.resize, capacity):
                return True

    def _count_evicted(self, blocks: Sequence[EvictedBlock]) -> None:
        """The ages of the evicted blocks of the request created last, in caches and seconds."""
        # A chain evicted at once is one run of a shared record (an identity test each); the
        # counters are updated item by item (a Counter built and added per request cost more).
        ages, seconds, created = self.result.evicted_ages, self.result.evicted_seconds, self._created
        now = created[-1]
        for block, run in groupby(blocks):
            age, n = block.age, len(list(run))
            ages[age] += n
            if now is not None:  # ``age`` caches were created between the eviction and this one
                then = created[max(len(created) - 2 - age, 0)]  # the one the eviction made room for
                if then is not None:
                    seconds[round(now - then, 3)] += n

    def _close(self, live: _Live) -> None:
        if self.recorder is not None:  # what it committed past its tokens: output decoded
            decoded = live.cache.num_committed_tokens - len(live.tokens)
            self.recorder.closing(id(live), live.request.output[live.generated : live.generated + max(decoded, 0)])
        self._timed(live.cache.close)

    def _requeue(self, live: _Live) -> None:
        """Close an open request and queue it first, to be re-admitted with what it generated."""
        self._close(live)
        live.open = False
        generated = live.generated_by(self.steps)
        tokens = live.tokens
        if len(tokens) < live.request.prompt_length + generated:
            prompt = tokens[: live.request.prompt_length]  # a prefix of what it ran with: no gather
            tokens = np.concatenate([prompt, live.request.output[:generated]]).astype(np.int32)
        self.pending.appendleft((live.index, tokens, generated, live.first))

    def _finish(self, live: _Live, rejected: bool = False) -> None:
        self._close(live)
        live.open = False
        self.result.records[live.index].rejected = rejected
        if live.first:  # rejected before it started: its prompt counts, all of it missed
            self.admitted_prompt += live.request.prompt_length
            self.result.records[live.index].step = self.steps
        self.done += 1

    # -- the loop ---------------------------------------------------------------------------------------

    def run(self, requests: list[Request]) -> ReplayResult:
        with tier_errors(self.config):  # a level that fails (a disk tier's files) is a TierError naming it
            self.begin(requests)
            # Every request is queued: only a step can start one.
            self._ahead_now = self.ahead and self.batched and self.events is None
            try:
                while self.busy:
                    self.step()
            finally:
                self._ahead_now = False
            return self.end()

    # A replay in parts, for a cluster that hands each instance its requests as they arrive:
    # begin(), then submit() and step() while busy, then end(), inside tier_errors(config).

    def begin(self, requests: Sequence[Request] = ()) -> None:
        self.requests: list[Request] = []
        self.result = ReplayResult(
            self.backend.name,
            self.config.local_tiers[0].quota,
            self.config.tokens_per_block,
            [],
            levels=[level_name(t) for t in self.config.cache_tiers],
            level_quotas=[getattr(t, "quota", 0) for t in self.config.cache_tiers],  # a remote tier: 0
        )
        self.admitted_prompt = 0
        self.reused = 0
        self.done = 0
        self.pending: deque[_Queued] = deque()
        self._created: list[float | None] = []  # each create_kv_cache's request's arrival in seconds
        self.waiting = None
        # Free and evictable slots per pool group: as the last step left them, and when the
        # waiting request last failed to start.
        self._room: list[int] = []
        self._room_failed: list[int] = []
        self.running: list[_Live] = []  # oldest first
        # Running requests with their whole output, oldest first: closed in the next step after
        # its admissions; and by step, those generating their last token in it.
        self.complete: list[_Live] = []
        self._ending: dict[int, list[_Live]] = {}
        self._view = None  # of the running requests, until the list changes
        self.steps = 0
        self.wall_seconds = 0.0
        for request in requests:
            self.submit(request)

    def submit(self, request: Request, prompt: np.ndarray[Any, np.dtype[np.int32]] | None = None) -> None:
        """Queue ``request`` last; its ``prompt`` where the caller read it already (else it is
        read when the request is admitted: a trace's may be gathered then)."""
        self.pending.append((len(self.requests), prompt, 0, True))
        self.requests.append(request)
        record = RequestRecord(request.prompt_length, len(request.output), name=request.name)
        record.prefix = first_block(request, self.config.tokens_per_block)
        self.result.records.append(record)

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    @property
    def open_requests(self) -> int:
        """Queued, waiting and running requests: the load a router balances."""
        return len(self.pending) + (self.waiting is not None) + len(self.running)

    def _run(self, live: _Live) -> None:
        """``live`` started: it runs, and completes this step if it has nothing to generate."""
        self.running.append(live)
        self._view = None
        live.step = self.steps
        live.remaining = iter(live.output[live.generated :])
        left = len(live.output) - live.generated
        if left:
            self._ending.setdefault(live.step + left - 1, []).append(live)
        else:
            self.complete.append(live)

    def step(self) -> None:
        wall = _now()
        running = self.running
        done_before = self.done
        # A waiting request tries again only once some pool group has more room than when it
        # failed: until then its pages still cannot be found, and a try costs a prefix walk.
        if self.waiting is not None and (not running or self._room_grew()):
            if self._start(self.waiting):
                self._run(self.waiting)
                self.waiting = None
            elif not running:  # alone with the whole pool and still cannot start: never will
                self._finish(self.waiting, rejected=True)
                self.waiting = None
            else:
                self._room_failed = self._room_now()
        # First come, first served: nothing is admitted past a waiting request.
        while self.waiting is None and self.pending and len(running) < self.max_in_flight:
            live = self._admit(self.pending.popleft())
            if self._start(live):
                self._run(live)
            elif running:
                self.waiting = live
                self._room_failed = self._room_now()
            else:
                self._finish(live, rejected=True)
        for live in self.complete:
            running.remove(live)
            self._view = None
            self._finish(live)
        self.complete.clear()
        if not running:
            decoded = 0
        elif (n := self._steps_ahead()) > 1:
            resized = self._decode_ahead(n)
            if resized is None:  # the steps it ran are done, each sampled
                self.wall_seconds += _now() - wall
                if self.progress is not None:
                    self.progress(self.done, len(self.requests))
                return
            view = self._decode_view()
            decoded = self._decode_resized(view, resized, [base + self.steps for base in view.capacity_base])
        else:
            decoded = self._decode()
        if self.done == done_before and not decoded:
            raise RuntimeError(f"replay made no progress at step {self.steps} (a bug in the replayer)")
        if self.events is not None:  # the step's events, removals too, go out as an engine's do
            self._timed(self.events.flush_iteration_events)
        self._sample(self.steps)
        self.steps += 1
        if self.progress is not None:
            self.progress(self.done, len(self.requests))
        self.wall_seconds += _now() - wall

    def _room_now(self) -> list[int]:
        """Free and evictable slots of every pool group."""
        self._room = [s.free + s.evictable for s in self.manager.get_storage_statistics()]
        return self._room

    def _room_grew(self) -> bool:
        """Whether some pool group has more room now (as the last step left it) than when the
        waiting request last failed to start."""
        return any(now > then for now, then in zip(self._room, self._room_failed, strict=True))

    def end(self) -> ReplayResult:
        self.result.steps = self.steps
        self.result.wall_seconds = self.wall_seconds
        stats = self.manager.get_committed_stats()
        self.result.evicted_pages = stats.evicted_pages
        if self.tiered:
            self.result.onboarded_pages = stats.onboarded_pages
            self.result.bytes_moved = dict(self.manager.get_bytes_moved())
        self.result.level_utilization = []
        for level in range(len(self.config.local_tiers)):
            pools = self.manager.get_storage_statistics(level) if level else self.manager.get_storage_statistics()
            self.result.level_utilization.append(_occupancy([p.total for p in pools], [p.free for p in pools]))
        if self.config.remote_tier is not None:
            self.result.remote = {name: getattr(stats, field) for name, field in REMOTE_COUNTERS.items()}
        self.result.peak_resident_bytes = resident.peak_bytes()
        return self.result

    def _sample(self, step: int) -> None:
        stats = self.manager.get_storage_statistics()
        self._samples(step, [s.total for s in stats], [[s.free for s in stats]], [[s.evictable for s in stats]])

    def _samples(self, first: int, totals: list[int], frees: list[list[int]], evictables: list[list[int]]) -> None:
        """The state after steps ``first``, ``first + 1``, ...: each pool group's slots (of
        ``totals``) free and evictable after each step."""
        done, prompt, reused, samples = self.done, self.admitted_prompt, self.reused, self.result.samples
        if len(totals) == 1:  # the usual single pool group, without the generators' cost
            (total,) = totals
            for step, (free,), (evictable,) in zip(count(first), frees, evictables):
                in_use = total - free - evictable
                samples.append(Sample(step, done, prompt, reused, in_use / total, (total - free) / total))
        else:
            for step, free_slots, evictable_slots in zip(count(first), frees, evictables):
                held = [t - f - e for t, f, e in zip(totals, free_slots, evictable_slots, strict=True)]
                utilization = max(u / t for u, t in zip(held, totals, strict=True))
                samples.append(Sample(step, done, prompt, reused, utilization, _occupancy(totals, free_slots)))
        if frees:
            self._room = [f + e for f, e in zip(frees[-1], evictables[-1], strict=True)]


class _DecodeView:
    """What the decode step reads of the running requests, as lists in their order: rebuilt
    only when the list changes (admissions, completions and preemptions, a few thousand times
    in a replay of a million decoded tokens). At step ``k`` request ``i`` resizes to
    ``capacity_base[i] + k`` and commits the next token of ``remaining[i]``."""

    def __init__(self, running: list[_Live]) -> None:
        self.caches = [live.cache for live in running]
        self.capacity_base = [len(live.tokens) - live.step + 1 for live in running]
        self.remaining = [live.remaining for live in running]
        self.ones = [1] * len(running)  # commit_many's counts


def _occupancy(totals: list[int], frees: list[int]) -> float:
    """The fullest pool group's share of slots holding pages (in use or cached), of ``totals``
    with ``frees`` free."""
    return max((t - f) / t for t, f in zip(totals, frees, strict=True))
