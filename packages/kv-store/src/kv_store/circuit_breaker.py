"""A circuit breaker for a remote store (docs/store.md, "Faults"): after a failure the store stops
calling the server for a backoff period, so a dead server costs misses, not a timeout per call.

closed --failure--> open --backoff elapsed--> half-open (one trial call) --success--> closed
                                                      \\--failure--> open, backoff doubled (to a cap)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import Enum

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class CircuitBreaker:
    """Thread-safe. ``allow()`` before a call; then ``record_success()`` or ``record_failure()``.

    The n-th failure in a row opens it for ``min(cap_s, base_s * 2**(n-1))`` seconds of ``clock``.
    A trial that never reports (a bug in the caller) is given up after ``cap_s``, so the breaker
    cannot stay half-open for ever."""

    def __init__(self, *, base_s: float = 1.0, cap_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("need 0 < base_s <= cap_s")
        self.base_s = base_s
        self.cap_s = cap_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0  # in a row
        self._until = 0.0  # open: when a trial may go; half-open: when the trial is given up
        self.opens = 0

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._state

    def allow(self) -> bool:
        """Whether a call may go to the server now (in half-open, only the one trial)."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                return True
            now = self._clock()
            if now < self._until:
                return False
            # open and the backoff is over, or a half-open trial overdue: this call is the trial
            self._state = BreakerState.HALF_OPEN
            self._until = now + self.cap_s
            return True

    def record_success(self) -> None:
        with self._lock:
            # a success of a call sent before the breaker opened proves nothing now
            if self._state is BreakerState.HALF_OPEN:
                self._state = BreakerState.CLOSED
                self._failures = 0
            elif self._state is BreakerState.CLOSED:
                self._failures = 0

    def record_failure(self) -> bool:
        """Count a failed call; True when it opened the breaker (False: it was open already)."""
        with self._lock:
            if self._state is BreakerState.OPEN:
                return False
            self._failures += 1
            backoff = min(self.cap_s, self.base_s * 2.0 ** min(self._failures - 1, 60))
            self._state = BreakerState.OPEN
            self._until = self._clock() + backoff
            self.opens += 1
            return True

    @property
    def closed(self) -> bool:
        """Whether it is closed, read without the lock (a hot path's check: a stale answer costs
        one call let through or refused)."""
        return self._state is BreakerState.CLOSED

    def retry_in(self) -> float:
        """Seconds until a trial may go (0 when closed or a trial may go now)."""
        with self._lock:
            if self._state is not BreakerState.OPEN:
                return 0.0
            return max(0.0, self._until - self._clock())

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.state.value}, failures={self._failures})"
