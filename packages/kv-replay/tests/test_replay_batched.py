"""The decode step's batched calls (``resize_many``, ``commit_many``) replay exactly as one call per
cache: the same reuse, preemptions, rejections, evictions and per-step samples, on every backend."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import kv_api
from kv_replay.model import model_config
from kv_replay.replayer import Replayer, ReplayResult
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
def workloads(draw: st.DrawFn) -> tuple[list[Request], int, int, int]:
    tpb = draw(st.sampled_from([1, 2, 4, 8]))
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
    return requests, tpb, slots, draw(st.integers(2, 8))


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_batched_decode_replays_as_one_call_per_cache(backends: list[kv_api.Backend], workload: Any) -> None:
    requests, tpb, slots, in_flight = workload
    outcomes = []
    for backend in backends:
        batched = replayer(backend, tpb, slots, in_flight)
        assert batched.batch_pages == [1]
        single = replayer(backend, tpb, slots, in_flight)
        single.batch_pages = None  # the per-cache path
        expected = outcome(single.run(requests))
        assert outcome(batched.run(requests)) == expected
        outcomes.append(expected)
    assert all(o == outcomes[0] for o in outcomes)


def test_the_decode_step_is_batched(backend: kv_api.Backend) -> None:
    # Eight requests decoding 40 tokens each in a pool that holds them all: one resize_many and
    # one commit_many per step, except where a block a commit fills comes before one a resize starts.
    requests = [Request(synthetic_tokens(i, 20), synthetic_tokens(100 + i, 40)) for i in range(8)]
    r = replayer(backend, 32, 64, 8)
    calls = spy(r)
    result = r.run(requests)
    assert all(not rec.rejected and rec.preemptions == 0 for rec in result.records)
    # Step 0 admits and decodes all eight (prompts of 20: no block boundary before token 32).
    assert calls.calls["resize_many"] >= result.steps - 2
    assert calls.calls["commit_many"] == calls.calls["resize_many"]


def test_windowed_and_ssm_layers_decode_one_cache_at_a_time(backend: kv_api.Backend) -> None:
    for layers in ("1,1x8", "1,1ssm"):
        r = replayer(backend, 4, 32, 4, layers)
        assert r.batch_pages is None  # commits there release or snapshot pages: order matters
        calls = spy(r)
        r.run([Request(synthetic_tokens(i, 6), synthetic_tokens(9 + i, 5)) for i in range(3)])
        assert calls.calls == {"resize_many": 0, "commit_many": 0}


def test_a_resize_that_finds_no_page_inside_a_batch_is_handled(backends: list[kv_api.Backend]) -> None:
    # Not counting the free slots first (batch_pages of 0), the batch runs into a full pool: the
    # requests after the failing resize continue one at a time, and the replay still ends with
    # every request completed or rejected, identically on every backend.
    requests = [Request(synthetic_tokens(i, 7), synthetic_tokens(50 + i, 12)) for i in range(6)]
    outcomes = []
    for backend in backends:
        r = replayer(backend, 4, 10, 6)
        r.batch_pages = [0]
        calls = spy(r)
        result = r.run(requests)
        assert calls.calls["resize_many"] > 0
        assert sum(rec.preemptions for rec in result.records) > 0  # the pool did run out
        assert result.samples[-1].completed == len(requests)
        outcomes.append(outcome(result))
    assert all(o == outcomes[0] for o in outcomes)
