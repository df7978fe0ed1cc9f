"""What a block store counts (every store has the same counters, so a report reads any)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StoreStats"]


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
