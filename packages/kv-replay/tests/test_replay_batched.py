"""The decode step's batched calls (``resize_many``, ``commit_many``) replay exactly as the same calls
one cache at a time: the same reuse, preemptions, rejections, evictions and per-step samples, on
every backend and every kind of layer."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from replay_gates import having, layer_needs, skip_unless, skip_unless_any

import kv_api
from kv_replay.model import model_config
from kv_replay.replay_result import ReplayResult
from kv_replay.replayer import Replayer
from kv_replay.trace import Request, synthetic_tokens

GRANULE = 2 << 20


def replayer(backend: kv_api.Backend, tpb: int, slots: int, in_flight: int, layers: str = "1") -> Replayer:
    config = model_config(layers, tpb, GRANULE, GRANULE // (2 * tpb * slots))
    return Replayer(backend, config, in_flight)


def outcome(result: ReplayResult) -> Any:
    records = [(r.reused_tokens, r.preemptions, r.rejected, r.reused_by_level) for r in result.records]
    samples = [(s.completed, s.prompt_tokens, s.reused_tokens, s.utilization, s.occupancy) for s in result.samples]
    return records, samples, result.evicted_pages, result.steps, result.level_utilization


class Spy:
    """A manager that counts the batched calls it forwards."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.calls = {"resize_many": 0, "commit_many": 0}
        self.steps: list[int] = []  # each decode_steps call's
        self.waiting: list[bool] = []  # whether it was told a waiting request's room

    def decode_steps(self, caches: Any, tokens: Any, steps: int, until_room: Any = None) -> Any:
        self.steps.append(steps)
        self.waiting.append(until_room is not None)
        return self.manager.decode_steps(caches, tokens, steps, until_room)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)

    def resize_many(self, *args: Any) -> Any:
        self.calls["resize_many"] += 1
        return self.manager.resize_many(*args)

    def commit_many(self, *args: Any) -> Any:
        self.calls["commit_many"] += 1
        return self.manager.commit_many(*args)


def spy(r: Replayer) -> Spy:
    s = Spy(r.manager)
    r.manager = s  # type: ignore[assignment]
    return s


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Request], int, int, int, str]:
    tpb = draw(st.sampled_from([1, 2, 4, 8]))
    # Windowed and SSM layers: a resize by one may release or need pages anywhere, a commit may
    # snapshot (commit_min_snapshot).
    layers = draw(st.sampled_from(["1", "1", "1,1x8", "1,1ssm"]))
    slots = draw(st.integers(4, 40))
    pool_tokens = tpb * slots
    shared = synthetic_tokens(draw(st.integers(0, 3)), 4 * pool_tokens, stream=1)
    requests: list[Request] = []
    for i in range(draw(st.integers(2, 12))):
        repeat: bool = draw(st.booleans())
        if requests and repeat:
            # The same prompt and answer as an earlier request: its decode fills blocks the tree
            # already has (a commit that rebases onto a page a resize could evict).
            requests.append(requests[draw(st.integers(0, len(requests) - 1))])
            continue
        length = draw(st.integers(1, pool_tokens))
        prefix = draw(st.integers(0, length))
        prompt = np.concatenate([shared[:prefix], synthetic_tokens(i, length - prefix, stream=2)])
        output = synthetic_tokens(draw(st.integers(0, 2)), draw(st.integers(0, 2 * pool_tokens)), stream=3)
        requests.append(Request(prompt.astype(np.int32), output))
    return requests, tpb, slots, draw(st.integers(2, 8)), layers


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_batched_decode_replays_as_one_call_per_cache(backends: list[kv_api.Backend], workload: Any) -> None:
    """Step by step with the batched calls, and ahead (``decode_steps`` over the steps that only
    decode), the replay is the single calls'."""
    requests, tpb, slots, in_flight, layers = workload
    batching = skip_unless_any(backends, "batched_calls")
    runnable = having(batching, *layer_needs(layers))  # those without SSM layers skip a model with them
    assume(runnable)
    outcomes = []
    for backend in runnable:
        ahead = replayer(backend, tpb, slots, in_flight, layers)
        assert ahead.batched and ahead.ahead
        batched = replayer(backend, tpb, slots, in_flight, layers)
        batched.ahead = False
        single = replayer(backend, tpb, slots, in_flight, layers)
        single.batched = False  # the same calls, one cache at a time
        calls = spy(single)
        expected = outcome(single.run(requests))
        assert calls.calls == {"resize_many": 0, "commit_many": 0} and calls.steps == []
        assert outcome(batched.run(requests)) == expected
        assert outcome(ahead.run(requests)) == expected
        outcomes.append(expected)
    assert all(o == outcomes[0] for o in outcomes)


@pytest.mark.requires("batched_calls")
@pytest.mark.parametrize("layers", ["1", "1,1x8", "1,1ssm"])
def test_the_decode_step_is_one_resize_many_and_one_commit_many(backend: kv_api.Backend, layers: str) -> None:
    skip_unless(backend, *layer_needs(layers))
    # Eight requests decoding 40 tokens each in a pool that holds them all: every step but the
    # last (where they all complete) decodes all eight with one call of each.
    requests = [Request(synthetic_tokens(i, 20), synthetic_tokens(100 + i, 40)) for i in range(8)]
    r = replayer(backend, 4, 1024, 8, layers)
    r.ahead = False
    calls = spy(r)
    result = r.run(requests)
    assert all(not rec.rejected and rec.preemptions == 0 for rec in result.records)
    assert result.steps == 41
    assert calls.calls == {"resize_many": 40, "commit_many": 40}


@pytest.mark.requires("batched_calls")
def test_the_steps_that_only_decode_are_one_decode_steps(backend: kv_api.Backend) -> None:
    # The same eight requests: they start in step 0 and generate their last tokens in step 39,
    # so steps 0..39 go as one call; step 40 completes them. A ninth queued behind them starts
    # in step 41 (admissions come before completions) and decodes in steps 41..80, one call more.
    requests = [Request(synthetic_tokens(i, 20), synthetic_tokens(100 + i, 40)) for i in range(9)]
    for n, calls_made, steps in ((8, [40], 41), (9, [40, 40], 82)):
        r = replayer(backend, 4, 1024, 8)
        calls = spy(r)
        result = r.run(requests[:n])
        assert result.steps == steps
        assert calls.steps == calls_made
        assert calls.calls == {"resize_many": 0, "commit_many": 0}
        assert [s.step for s in result.samples] == list(range(steps))  # each step sampled
        step_by_step = replayer(backend, 4, 1024, 8)
        step_by_step.ahead = False
        assert outcome(step_by_step.run(requests[:n])) == outcome(result)


@pytest.mark.requires("batched_calls")
def test_a_request_waiting_for_room_does_not_stop_decoding_ahead(backend: kv_api.Backend) -> None:
    # Two requests of 20 + 40 tokens fill most of 40 slots of 4 tokens; a third waits for room
    # while they decode ahead, told the room it failed with, and starts once one completes.
    requests = [Request(synthetic_tokens(i, 20), synthetic_tokens(100 + i, 40 + 8 * i)) for i in range(3)]
    r = replayer(backend, 4, 40, 3)
    calls = spy(r)
    result = r.run(requests)
    assert any(calls.waiting)
    assert sum(calls.steps) > result.steps / 2
    assert all(not rec.rejected for rec in result.records)
    step_by_step = replayer(backend, 4, 40, 3)
    step_by_step.ahead = False
    assert outcome(step_by_step.run(requests)) == outcome(result)


def test_a_resize_that_finds_no_page_inside_a_batch_is_handled(backends: list[kv_api.Backend]) -> None:
    # A pool too small for every request: resizes inside the batch find no page, those requests
    # preempt the newest ones and try again, and the replay still ends with every request
    # completed or rejected, identically on every backend and one cache at a time.
    requests = [Request(synthetic_tokens(i, 7), synthetic_tokens(50 + i, 12)) for i in range(6)]
    outcomes = []
    for backend in skip_unless_any(backends, "batched_calls"):
        r = replayer(backend, 4, 10, 6)
        calls = spy(r)
        result = r.run(requests)
        assert calls.calls["resize_many"] > 0
        assert sum(rec.preemptions for rec in result.records) > 0  # the pool did run out
        assert result.samples[-1].completed == len(requests)
        single = replayer(backend, 4, 10, 6)
        single.batched = False
        assert outcome(single.run(requests)) == outcome(result)
        outcomes.append(outcome(result))
    assert all(o == outcomes[0] for o in outcomes)


def test_a_backend_without_batched_calls_is_replayed_one_cache_at_a_time(backend: kv_api.Backend) -> None:
    """``batched_calls`` undeclared: the replayer makes the single calls, with the same outcome."""
    unbatched = cast(
        kv_api.Backend,
        SimpleNamespace(
            name=backend.name,
            KVCacheManager=backend.KVCacheManager,
            capabilities=dataclasses.replace(backend.capabilities, batched_calls=False),
        ),
    )
    requests = [Request(synthetic_tokens(i, 7), synthetic_tokens(50 + i, 12)) for i in range(6)]
    r = replayer(unbatched, 4, 10, 6)
    calls = spy(r)
    assert not r.batched
    result = r.run(requests)
    assert calls.calls == {"resize_many": 0, "commit_many": 0}
    assert outcome(result) == outcome(replayer(backend, 4, 10, 6).run(requests))
