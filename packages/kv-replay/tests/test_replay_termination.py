"""The replay always ends: every request completes or is rejected, within a step bound that the
workload sets, identically on every backend."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

import kv_api
from kv_replay.model import model_config
from kv_replay.replayer import Replayer, ReplayResult
from kv_replay.trace import Request, synthetic_tokens

GRANULE = 2 << 20  # the device granularity: quotas below it round up to it


def replay(
    backend: kv_api.Backend, requests: list[Request], tpb: int, slots: int, in_flight: int, layers: str = "1"
) -> ReplayResult:
    """``slots`` blocks of device memory per layer (one 2 MiB granule split into that many)."""
    per_layer = len(layers.split(","))
    config = model_config(layers, tpb, GRANULE * per_layer, GRANULE // (2 * tpb * slots), partial_reuse=True)
    return Replayer(backend, config, in_flight).run(requests)


def check_terminated(result: ReplayResult, requests: list[Request]) -> None:
    completed = sum(not r.rejected for r in result.records)
    rejected = sum(r.rejected for r in result.records)
    assert completed + rejected == len(requests)
    assert result.steps <= len(requests) + sum(len(r.output) for r in requests)
    # The per-step samples end where the summary does: every prompt counted, rejected ones missed.
    last = result.samples[-1]
    assert (last.completed, last.prompt_tokens) == (len(requests), sum(len(r.prompt) for r in requests))
    assert last.reused_tokens == sum(r.reused_tokens for r in result.records)


def test_a_request_larger_than_the_pool_is_rejected_and_the_rest_complete(backend: kv_api.Backend) -> None:
    # The regression: one request far larger than the pool, then small ones behind it. The replay
    # used to re-queue the small ones behind the large one forever.
    big = Request(synthetic_tokens(0, 20_000), synthetic_tokens(1, 4))
    small = [Request(synthetic_tokens(2 + i, 40), synthetic_tokens(10 + i, 4)) for i in range(3)]
    config = model_config("4", 32, 1 << 20, 256)
    result = Replayer(backend, config, 16).run([big, *small])
    assert [r.rejected for r in result.records] == [True, False, False, False]
    check_terminated(result, [big, *small])


def test_a_request_whose_output_outgrows_the_pool_is_rejected(backend: kv_api.Backend) -> None:
    # It starts (its prompt fits) but decoding alone runs out of pages: preempting itself would
    # restart it forever.
    requests = [
        Request(synthetic_tokens(0, 24), synthetic_tokens(1, 60)),
        Request(synthetic_tokens(2, 8), synthetic_tokens(3, 2)),
    ]
    result = replay(backend, requests, tpb=4, slots=16, in_flight=4)
    assert [r.rejected for r in result.records] == [True, False]
    check_terminated(result, requests)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Request], int, int, int, str]:
    tpb = draw(st.sampled_from([1, 2, 4, 8]))
    slots = draw(st.integers(2, 24))
    pool_tokens = tpb * slots
    shared = synthetic_tokens(draw(st.integers(0, 3)), 4 * pool_tokens, stream=1)
    requests = []
    for i in range(draw(st.integers(1, 10))):
        # Mostly requests that fit, some several times the pool.
        length = draw(st.one_of(st.integers(1, pool_tokens // 2 + 1), st.integers(1, 3 * pool_tokens)))
        prefix = draw(st.integers(0, length))  # shared prefixes make reuse and eviction happen
        prompt = np.concatenate([shared[:prefix], synthetic_tokens(i, length - prefix, stream=2)])
        requests.append(
            Request(prompt.astype(np.int32), synthetic_tokens(i, draw(st.integers(0, pool_tokens)), stream=3))
        )
    layers = draw(st.sampled_from(["1", "2", f"1,1x{2 * tpb}+1", "1,1ssm", f"1,1x{2 * tpb},1ssm"]))
    return requests, tpb, slots, draw(st.integers(1, 5)), layers


@settings(max_examples=150)  # cheap: small pools, short requests
@given(workloads())
def test_every_replay_terminates_alike_on_every_backend(backends: list[kv_api.Backend], workload: Any) -> None:
    requests, tpb, slots, in_flight, layers = workload
    results = [replay(b, requests, tpb, slots, in_flight, layers) for b in backends]
    for result in results:
        check_terminated(result, requests)
    first = results[0]
    event(f"rejected: {any(r.rejected for r in first.records)}")
    event(f"preempted: {any(r.preemptions for r in first.records)}")
    event(f"evicted: {first.evicted_pages > 0}")
    for other in results[1:]:
        assert [(r.reused_tokens, r.preemptions, r.rejected) for r in other.records] == [
            (r.reused_tokens, r.preemptions, r.rejected) for r in first.records
        ]
        assert (other.steps, other.evicted_pages) == (first.steps, first.evicted_pages)
