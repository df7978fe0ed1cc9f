"""What a block store counts (every store has the same counters, so a report reads any)."""

from __future__ import annotations

import bisect
import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["CALL_BUCKETS", "Counters", "StoreStats", "call_bucket"]

#: Upper bounds (seconds) of the call latency buckets: 10 µs to 1 s, then the rest.
CALL_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)


def call_bucket(seconds: float) -> int:
    """The bucket of a call that took ``seconds``: the first bound at or above it, or the last
    (``len(CALL_BUCKETS)``: beyond every bound)."""
    return bisect.bisect_left(CALL_BUCKETS, seconds)


@dataclass(frozen=True)
class StoreStats:
    """Counters since the store was opened.

    - ``lookups``: ``contains`` calls; ``gets``: ``get_into`` calls; ``hits``: blocks
      ``get_into`` returned; ``bad_values``: values refused (wrong length, unreadable);
    - ``puts``: blocks handed to ``put``; ``written``: blocks the store wrote; ``skipped``: blocks
      already stored (not written again); ``dropped``: blocks it did not write (bounded queue
      full, store down, write failed);
    - ``errors``: failed store operations (each cost misses or drops, never an exception);
      ``breaker_opens``: times the circuit breaker opened;
    - ``bytes_read`` / ``bytes_written``: value bytes each way;
    - ``call_seconds``: time spent inside ``contains``/``get_into``/``put`` (the caller's
      latency), ``calls`` how many, ``call_buckets`` how many took each ``CALL_BUCKETS`` bound
      or less (not counted in an earlier bucket), and last more than every bound;
    - ``evicted``: blocks a size-bounded store removed to make room (0 where it has no bound).
    """

    lookups: int = 0
    gets: int = 0
    hits: int = 0
    bad_values: int = 0
    puts: int = 0
    written: int = 0
    skipped: int = 0
    dropped: int = 0
    errors: int = 0
    breaker_opens: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    calls: int = 0
    call_seconds: float = 0.0
    evicted: int = 0
    call_buckets: tuple[int, ...] = (0,) * (len(CALL_BUCKETS) + 1)


@dataclass
class Counters:
    """A store's ``StoreStats`` as they count up, from any thread."""

    values: dict[str, float] = dataclasses.field(
        default_factory=lambda: {f.name: 0 for f in dataclasses.fields(StoreStats) if f.name != "call_buckets"}
    )
    buckets: list[int] = dataclasses.field(default_factory=lambda: [0] * (len(CALL_BUCKETS) + 1))
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def call(self, seconds: float) -> None:
        """One call that took ``seconds``."""
        bucket = call_bucket(seconds)
        with self.lock:
            self.values["calls"] += 1
            self.values["call_seconds"] += seconds
            self.buckets[bucket] += 1

    def add(self, **deltas: float) -> None:
        with self.lock:
            for name, delta in deltas.items():
                self.values[name] += delta

    def add_put(self, puts: int, dropped: int, seconds: float) -> None:
        """``add`` of a put call's counts, without its keyword dict (a decode puts every few tokens)."""
        with self.lock:
            values = self.values
            values["puts"] += puts
            values["dropped"] += dropped
            values["calls"] += 1
            values["call_seconds"] += seconds
            self.buckets[call_bucket(seconds)] += 1

    def snapshot(self) -> StoreStats:
        with self.lock:
            values: dict[str, Any] = {k: (v if k == "call_seconds" else int(v)) for k, v in self.values.items()}
            buckets = tuple(self.buckets)
        return StoreStats(**values, call_buckets=buckets)
