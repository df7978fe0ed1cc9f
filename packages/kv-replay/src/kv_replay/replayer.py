"""The replay loop: requests flow through a manager the way an inference engine drives it.

Every step: suspended requests are resumed (oldest first) when the manager lets them; new
requests are admitted while fewer than ``max_in_flight`` are in flight (``create_kv_cache`` with
reuse, ``resume``, ``resize`` to the prompt, then the prefill ``commit``); every running request
decodes one token (``resize`` by one, ``commit`` of one). A request the manager cannot resume or
size waits suspended; when a decode step runs out of pages the newest running request is
preempted (closed, its committed blocks left reusable) and re-queued first, to be re-admitted
with its prompt and the tokens generated so far. A request that cannot fit even alone is
rejected. Every decision depends only on what the manager returns, so two backends that
behave identically replay identically.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kv_replay.trace import Request


@dataclass
class RequestRecord:
    prompt_tokens: int
    output_tokens: int
    reused_tokens: int = 0  # at the first admission
    preemptions: int = 0
    rejected: bool = False
    admission_seconds: float | None = None  # create + resume + resize of the first admission


@dataclass
class Sample:
    """The state after one step."""

    step: int
    completed: int
    prompt_tokens: int  # of the requests admitted so far
    reused_tokens: int
    utilization: float  # the fullest pool group's share of slots in use by open caches
    occupancy: float  # the same, counting cached (evictable) pages too


@dataclass
class ReplayResult:
    backend: str
    records: list[RequestRecord]
    samples: list[Sample] = field(default_factory=list)
    evicted_pages: int = 0
    steps: int = 0
    manager_seconds: float = 0.0  # inside manager and cache calls
    hashed_tokens: int = 0  # given to create_kv_cache and commit
    hashing_seconds: float = 0.0  # inside those calls
    wall_seconds: float = 0.0


@dataclass
class _Live:
    index: int
    request: Request
    cache: Any
    tokens: np.ndarray[Any, np.dtype[np.int32]]  # prompt + tokens generated before a preemption
    generated: int
    first: bool  # the first admission (its reuse and latency are recorded)
    started: float = 0.0  # when create_kv_cache was called


class Replayer:
    def __init__(
        self, backend: Any, config: Any, max_in_flight: int, progress: Callable[[int, int], None] | None = None
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.backend = backend
        self.manager = backend.KVCacheManager(config)
        self.max_in_flight = max_in_flight
        self.progress = progress

    # -- timed manager calls --------------------------------------------------------------------------

    def _timed(self, call: Callable[[], Any], hashed: int = 0) -> Any:
        start = time.perf_counter()
        value = call()
        seconds = time.perf_counter() - start
        self.result.manager_seconds += seconds
        if hashed:
            self.result.hashed_tokens += hashed
            self.result.hashing_seconds += seconds
        return value

    # -- request life -------------------------------------------------------------------------------

    def _admit(self, index: int, tokens: np.ndarray[Any, np.dtype[np.int32]], generated: int, first: bool) -> _Live:
        request = self.requests[index]
        start = time.perf_counter()
        cache = self._timed(lambda: self.manager.create_kv_cache(request.scope, tokens), hashed=len(tokens))
        live = _Live(index, request, cache, tokens, generated, first, start)
        if first:
            self.result.records[index].reused_tokens = cache.num_committed_tokens
            self.admitted_prompt += len(request.prompt)
            self.reused += cache.num_committed_tokens
        return live

    def _start(self, live: _Live) -> bool:
        """Resume and size a suspended request, then prefill; False leaves it suspended."""
        cache = live.cache
        if not self._timed(cache.resume):
            return False
        if not self._timed(lambda: cache.resize(len(live.tokens))):
            self._timed(cache.suspend)
            return False
        if live.first and self.result.records[live.index].admission_seconds is None:
            self.result.records[live.index].admission_seconds = time.perf_counter() - live.started
        rest = live.tokens[cache.num_committed_tokens :]
        if len(rest):
            self._timed(lambda: cache.commit(rest), hashed=len(rest))
        return True

    def _decode(self, live: _Live) -> bool:
        """One token; False (nothing changed) when the manager has no page for it."""
        cache = live.cache
        if not self._timed(lambda: cache.resize(cache.capacity + 1)):
            return False
        token = live.request.output[live.generated : live.generated + 1]
        self._timed(lambda: cache.commit(token), hashed=1)
        live.generated += 1
        return True

    def _close(self, live: _Live) -> None:
        self._timed(live.cache.close)

    # -- the loop ---------------------------------------------------------------------------------------

    def run(self, requests: list[Request]) -> ReplayResult:
        self.requests = requests
        self.result = ReplayResult(self.backend.name, [RequestRecord(len(r.prompt), len(r.output)) for r in requests])
        self.admitted_prompt = 0
        self.reused = 0
        pending: deque[tuple[int, np.ndarray[Any, np.dtype[np.int32]], int, bool]] = deque(
            (i, r.prompt, 0, True) for i, r in enumerate(requests)
        )
        waiting: list[_Live] = []
        running: list[_Live] = []
        done = 0
        step = 0
        wall = time.perf_counter()
        while pending or waiting or running:
            moved = False
            while waiting and self._start(waiting[0]):  # oldest first: no overtaking
                running.append(waiting.pop(0))
                moved = True
            while pending and len(waiting) + len(running) < self.max_in_flight:
                live = self._admit(*pending.popleft())
                (running if not waiting and self._start(live) else waiting).append(live)
                moved = True
            for live in list(running):
                if live not in running:
                    continue  # preempted by an older request this step
                if live.generated == len(live.request.output):
                    self._close(live)
                    running.remove(live)
                    done += 1
                    moved = True
                    continue
                while not self._decode(live):
                    victim = running.pop()  # the newest request makes room
                    self._close(victim)
                    self.result.records[victim.index].preemptions += 1
                    resumed = np.concatenate([victim.request.prompt, victim.request.output[: victim.generated]])
                    pending.appendleft((victim.index, resumed.astype(np.int32), victim.generated, False))
                    moved = True
                    if victim is live:
                        break
                else:
                    moved = True
            if not moved and waiting and not running:
                if len(waiting) > 1:  # the suspended ones behind it hold pages it needs
                    for live in reversed(waiting[1:]):
                        self._close(live)
                        pending.appendleft((live.index, live.tokens, live.generated, live.first))
                    del waiting[1:]
                else:
                    live = waiting.pop(0)  # it cannot fit even alone
                    self._close(live)
                    self.result.records[live.index].rejected = True
                    done += 1
            self._sample(step, done)
            step += 1
            if self.progress is not None:
                self.progress(done, len(requests))
        self.result.steps = step
        self.result.wall_seconds = time.perf_counter() - wall
        self.result.evicted_pages = self.manager.get_committed_stats().evicted_pages
        return self.result

    def _sample(self, step: int, done: int) -> None:
        stats = self.manager.get_storage_statistics()
        self.result.samples.append(
            Sample(
                step,
                done,
                self.admitted_prompt,
                self.reused,
                max(s.unavailable / s.total for s in stats),
                max((s.total - s.free) / s.total for s in stats),
            )
        )
