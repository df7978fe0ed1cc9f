"""What a block store counts (every store has the same counters, so a report reads any)."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["Counters", "StoreStats"]


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
      latency), ``calls`` how many;
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


@dataclass
class Counters:
    """A store's ``StoreStats`` as they count up, from any thread."""

    values: dict[str, float] = dataclasses.field(
        default_factory=lambda: {f.name: 0 for f in dataclasses.fields(StoreStats)}
    )
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

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

    def snapshot(self) -> StoreStats:
        with self.lock:
            values: dict[str, Any] = {k: (v if k == "call_seconds" else int(v)) for k, v in self.values.items()}
        return StoreStats(**values)
