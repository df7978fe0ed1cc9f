"""CircuitBreaker with a fake clock."""

from __future__ import annotations

import pytest

from kv_store.circuit_breaker import BreakerState, CircuitBreaker


def _state(breaker: CircuitBreaker) -> BreakerState:
    return breaker.state  # a call: mypy would keep a narrowed property across allow()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_on_a_failure_and_backs_off_to_a_cap() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(base_s=1.0, cap_s=4.0, clock=clock)
    assert breaker.allow() and _state(breaker) is BreakerState.CLOSED
    assert breaker.record_failure() is True
    assert _state(breaker) is BreakerState.OPEN and not breaker.allow()
    assert breaker.retry_in() == pytest.approx(1.0)
    for backoff in (2.0, 4.0, 4.0):  # each failed trial doubles it, up to the cap
        clock.now += breaker.retry_in()
        assert breaker.allow() and _state(breaker) is BreakerState.HALF_OPEN
        assert breaker.record_failure() is True
        assert breaker.retry_in() == pytest.approx(backoff)
    assert breaker.opens == 4


def test_half_open_lets_one_trial_through() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(base_s=1.0, cap_s=8.0, clock=clock)
    breaker.record_failure()
    clock.now += 0.999
    assert not breaker.allow()
    clock.now += 0.002
    assert breaker.allow()  # the trial
    assert not breaker.allow() and not breaker.allow()  # everyone else waits for it
    breaker.record_success()
    assert _state(breaker) is BreakerState.CLOSED and breaker.allow()
    breaker.record_failure()  # a success reset the backoff
    assert breaker.retry_in() == pytest.approx(1.0)


def test_a_failure_while_open_does_not_extend_it() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(base_s=1.0, cap_s=8.0, clock=clock)
    assert breaker.record_failure() is True
    assert breaker.record_failure() is False  # a call sent before it opened
    assert breaker.retry_in() == pytest.approx(1.0) and breaker.opens == 1
    breaker.record_success()  # nor does a late success close it
    assert _state(breaker) is BreakerState.OPEN


def test_a_lost_trial_is_given_up_after_the_cap() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(base_s=1.0, cap_s=3.0, clock=clock)
    breaker.record_failure()
    clock.now += 1.0
    assert breaker.allow()  # a trial that never reports
    clock.now += 2.9
    assert not breaker.allow()
    clock.now += 0.2
    assert breaker.allow()


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(base_s=0.0)
    with pytest.raises(ValueError):
        CircuitBreaker(base_s=2.0, cap_s=1.0)
