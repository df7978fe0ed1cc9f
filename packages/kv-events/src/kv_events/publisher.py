"""A background thread that publishes a manager's events on the wire, as vLLM's engines do.

Frames: ``[topic, sequence number (8 bytes, big-endian, from 0, one per batch), msgpack
EventBatch]`` on an XPUB socket (a PUB that also sees subscriptions, so ``wait_for_subscribers``
can tell when a router listens). The last ``buffer_steps`` batches are kept for replay on an
optional ROUTER socket: a request ``[b"", start (8 bytes, big-endian)]`` from a DEALER (or REQ) is
answered by one ``[b"", seq, payload]`` per buffered batch from ``start`` on, then the end marker
``[b"", -1 (8 bytes, signed big-endian), b""]``.

The thread drains ``get_latest_events(timeout_ms=0)`` every ``poll_ms``; whoever drives the manager calls
``flush_iteration_events()`` at each engine step, as without a publisher (removals are buffered
until then). ``flush()`` publishes everything up to now before it returns; ``close()`` (or leaving
the ``with`` block) flushes, publishes the final batch, lingers up to ``linger_ms`` for it to leave,
and closes the sockets. Draining and sending hold one lock, so batches leave in event order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from types import TracebackType

import zmq

from kv_api import KVCacheEventManager, KVCacheManagerConfig
from kv_events.endpoint import bind
from kv_events.mapping import WireMapper, check_hash_algo
from kv_events.wire import EventBatch, WireEvent, encode_batch

__all__ = ["END_SEQ", "EventPublisher"]

#: The replay's end marker: -1 as a signed 8-byte big-endian integer.
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventPublisher:
    def __init__(
        self,
        events: KVCacheEventManager,
        config: KVCacheManagerConfig,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        data_parallel_rank: int = 0,
        poll_ms: int = 10,
        linger_ms: int = 1000,
    ) -> None:
        """``events`` is the event manager of the manager built with ``config``; ``endpoint`` (and
        ``replay_endpoint``) are bound here (``tcp://127.0.0.1:*`` picks a free port; ``endpoint``
        then says which)."""
        check_hash_algo(events.hash_algo)
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1 (got {buffer_steps})")
        self._events = events
        self._mapper = WireMapper.for_config(config)
        self._topic = topic.encode()
        self._rank = data_parallel_rank
        self._poll_ms = poll_ms
        self._linger_ms = linger_ms
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._published_events = 0
        self._subscriptions = 0
        self._lock = threading.Lock()  # draining + sending, and the sockets
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscription, not the first only
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self.endpoint = bind(self._pub, endpoint)
            self.replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self.replay_endpoint = bind(self._replay, replay_endpoint)
        except BaseException:
            self._close_sockets(0)
            raise
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    # -- what a caller reads -----------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The sequence number of the next batch (so: batches published so far)."""
        return self._seq

    @property
    def published_events(self) -> int:
        return self._published_events

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def wait_for_subscribers(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Whether ``count`` subscriptions arrived within ``timeout`` seconds (ZeroMQ drops what a
        PUB sends before a subscriber's subscription arrives)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._subscriptions >= count, timeout)

    # -- publishing --------------------------------------------------------------------------------

    def flush(self) -> int:
        """Flush the iteration's events and publish everything up to now; the next sequence
        number."""
        if self.closed:
            raise ValueError("flush() on a closed EventPublisher")
        self._events.flush_iteration_events()
        with self._lock:
            self._drain()
            return self._seq

    def send(self, events: list[WireEvent]) -> int:
        """Publish ``events`` of the caller's own as one batch (say, a marker whose arrival at a
        consumer shows it has applied everything before); its sequence number."""
        if self.closed:
            raise ValueError("send() on a closed EventPublisher")
        with self._lock:
            return self._send(events)

    def _send(self, wire: list[WireEvent]) -> int:
        """With the lock held: one batch on the wire and in the replay buffer."""
        payload = encode_batch(EventBatch(time.time(), wire, self._rank))
        seq = self._seq
        self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
        self._buffer.append((seq, payload))
        self._seq = seq + 1
        self._published_events += len(wire)
        return seq

    def _drain(self) -> None:
        """With the lock held: one drain of the event manager, published as one batch."""
        wire: list[WireEvent] = []
        for event in self._events.get_latest_events(0):
            wire.extend(self._mapper.map(event))
        if wire:  # else nothing a router would see: no sequence number spent
            self._send(wire)

    def _run(self) -> None:
        # The wait holds no lock: a thread that blocked in get_latest_events holding it would
        # starve flush() (Python's locks are not fair), and one that blocked without it could
        # take events that a flush() then overtakes.
        while not self._stop.wait(self._poll_ms / 1000):
            with self._lock:
                self._drain()
                self._serve()

    def _serve(self) -> None:
        """With the lock held: count subscriptions and answer replay requests."""
        while self._pub.poll(0):
            message = self._pub.recv()
            if message[:1] == b"\x01":
                with self._changed:
                    self._subscriptions += 1
                    self._changed.notify_all()
        while self._replay is not None and self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) < 2 or len(frames[-1]) != 8:
                continue  # not a replay request: ignored, as vLLM does
            client, start = frames[0], int.from_bytes(frames[-1], "big")
            for seq, payload in self._buffer:
                if seq >= start:
                    self._replay.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            self._replay.send_multipart([client, b"", END_SEQ, b""])

    # -- shutdown ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Publish what is left, stop the thread and close the sockets; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()  # it wakes at once
        try:
            self._events.flush_iteration_events()
            self._drain()
        finally:
            self._close_sockets(self._linger_ms)

    def _close_sockets(self, linger_ms: int) -> None:
        self._pub.close(linger=linger_ms)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
