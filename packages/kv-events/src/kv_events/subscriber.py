"""A SUB client of an ``EventPublisher`` (or a vLLM engine): decoded batches in sequence order,
gaps fetched from the replay socket when one is given.

The first batch received sets where the stream starts, unless ``from_seq`` is given: then the
first ``receive`` asks the replay socket for every batch from ``from_seq`` on. After that a jump in sequence numbers is a gap: the missing batches are fetched
from the replay socket and delivered first. What the replay cannot give (no replay socket, or
batches already out of its buffer) is recorded in ``missed`` as ``(first, last)`` ranges.
"""

from __future__ import annotations

import time
from collections import deque
from types import TracebackType

import zmq

from kv_events.endpoint import connect
from kv_events.publisher import END_SEQ
from kv_events.wire import EventBatch, decode_batch

__all__ = ["EventSubscriber"]


class EventSubscriber:
    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        from_seq: int | None = None,
        replay_timeout_ms: int = 2000,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.missed: list[tuple[int, int]] = []
        self._expected = from_seq
        self._catch_up = from_seq is not None and replay_endpoint is not None
        self._replay_timeout_ms = replay_timeout_ms
        self._ready: deque[tuple[int, EventBatch]] = deque()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            connect(self._sub, endpoint)
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.DEALER)
                connect(self._replay, replay_endpoint)
        except BaseException:
            self.close()
            raise

    def receive(self, timeout_ms: int | None = None) -> tuple[int, EventBatch] | None:
        """The next batch and its sequence number; None if nothing came within ``timeout_ms``
        (None: wait for ever). A payload that is not a batch raises ``ValueError``."""
        if self._catch_up and self._expected is not None:
            self._catch_up = False
            self._fetch(self._expected, None)
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while not self._ready:
            left = None if deadline is None else max(0, round((deadline - time.monotonic()) * 1000))
            if not self._sub.poll(left):
                return None
            _topic, seq_bytes, payload = self._sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            if self._expected is not None and seq > self._expected:
                self._fetch(self._expected, seq)
            if self._expected is None or seq >= self._expected:  # else replayed already
                self._ready.append((seq, decode_batch(payload)))
                self._expected = seq + 1
        return self._ready.popleft()

    def _fetch(self, start: int, end: int | None) -> None:
        """Batches ``[start, end)`` (``end`` None: all it has) from the replay socket into the
        ready queue; what it lacks goes to ``missed``."""
        got = start
        if self._replay is not None:
            self._replay.send_multipart([b"", start.to_bytes(8, "big")])
            while self._replay.poll(self._replay_timeout_ms):
                frames = self._replay.recv_multipart()
                if frames[-2] == END_SEQ:
                    break
                seq = int.from_bytes(frames[-2], "big")
                if got <= seq and (end is None or seq < end):
                    if seq > got:
                        self.missed.append((got, seq - 1))
                    self._ready.append((seq, decode_batch(frames[-1])))
                    got = seq + 1
        if end is not None and got < end:
            self.missed.append((got, end - 1))
        self._expected = max(got, self._expected or 0)

    def close(self) -> None:
        self._sub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> EventSubscriber:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
