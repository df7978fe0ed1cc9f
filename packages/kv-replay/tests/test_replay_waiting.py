"""A request waiting for room tries to start again only once some pool group has more room than
when it last failed: the replay is the same as one that tries in every step, on every backend and
every kind of layer, with far fewer tries."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given, settings
from replay_gates import having, layer_needs
from test_replay_batched import outcome, replayer, workloads

import kv_api
from kv_replay.replayer import Replayer
from kv_replay.trace import Request, synthetic_tokens


def trying_every_step(r: Replayer) -> Replayer:
    """``r``, its waiting request trying in every step: step by step (a run of decode steps
    ahead would only stop where room grew)."""
    r._room_grew = lambda: True  # type: ignore[method-assign]
    r.ahead = False
    return r


def counting_starts(r: Replayer) -> list[int]:
    starts = [0]
    start = r._start

    def counted(live: Any) -> bool:
        starts[0] += 1
        return start(live)

    r._start = counted  # type: ignore[method-assign]
    return starts


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_waiting_for_room_replays_as_trying_every_step(backends: list[kv_api.Backend], workload: Any) -> None:
    requests, tpb, slots, in_flight, layers = workload
    runnable = having(backends, *layer_needs(layers))
    assume(runnable)
    outcomes = []
    for backend in runnable:
        expected = outcome(trying_every_step(replayer(backend, tpb, slots, in_flight, layers)).run(requests))
        assert outcome(replayer(backend, tpb, slots, in_flight, layers).run(requests)) == expected
        outcomes.append(expected)
    assert all(o == outcomes[0] for o in outcomes)


def test_a_request_waiting_for_room_tries_again_when_room_is_freed(backend: kv_api.Backend) -> None:
    # 20 slots of 4 tokens. The first request holds 11 of them, and 16 by the end of its 20
    # steps; the second needs 10 from its admission on, and waits for the first to complete.
    first = Request(synthetic_tokens(1, 44), synthetic_tokens(2, 20))
    second = Request(synthetic_tokens(3, 40), synthetic_tokens(4, 3))
    every = trying_every_step(replayer(backend, 4, 20, 2))
    every_starts = counting_starts(every)
    expected = outcome(every.run([first, second]))
    waiting = replayer(backend, 4, 20, 2)
    starts = counting_starts(waiting)
    assert outcome(waiting.run([first, second])) == expected
    assert every_starts[0] >= 20  # the second request tried in each of the first one's steps
    # The first's start, the second's when admitted, and once the first completed.
    assert starts[0] == 3
    assert [r.preemptions for r in waiting.result.records] == [0, 0]
