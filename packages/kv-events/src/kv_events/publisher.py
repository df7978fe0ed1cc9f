"""A background thread that publishes a manager's events on the wire, as vLLM's engines do.

Frames: ``[topic, sequence number (8 bytes, big-endian, from 0, one per batch), msgpack
EventBatch]`` on an XPUB socket (a PUB that also sees subscriptions, so ``wait_for_subscribers``
can tell when a router listens, and when it has left). The last ``buffer_steps`` batches are kept
for replay on an optional ROUTER socket: a request ``[b"", start (8 bytes, big-endian)]`` from a
DEALER (or REQ) is answered by one ``[b"", seq, payload]`` per buffered batch from ``start`` on,
then the end marker ``[b"", -1 (8 bytes, signed big-endian), b""]``; every batch of the answer
arrives, however slowly the client reads (what its queue does not take now is sent later).

The thread drains ``get_latest_events(timeout_ms=0)`` every ``poll_ms``; whoever drives the manager
calls ``flush_iteration_events()`` at each engine step, as without a publisher (removals are
buffered until then). ``flush()`` publishes everything up to now before it returns; ``close()``
(or leaving the ``with`` block) flushes, publishes the final batch, lingers up to ``linger_ms``
for it to leave, and closes the sockets. Draining, sending and closing hold one lock, so batches
leave in event order, and a ``flush()`` or ``send()`` either completes before ``close()`` or
raises ``ValueError`` (closed). Endpoints are checked strictly (``kv_events.endpoint``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from types import TracebackType

import zmq
from zmq.utils.monitor import parse_monitor_message

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
        self._answers: dict[bytes, deque[tuple[bytes, bytes]]] = {}  # replay frames not sent yet, per client
        self._seq = 0
        self._published_events = 0
        self._subscriptions = 0  # to our topic, net of unsubscriptions
        self._peers: set[int] = set()  # connected subscribers, by file descriptor
        self._lock = threading.Lock()  # draining + sending, and the sockets
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._closed = threading.Event()  # the sockets are closed
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        # Every subscription and unsubscription passes, one per topic of a subscriber that leaves
        # too (by default only a topic's first and last): live subscribers can be counted. The
        # monitor says which peers are connected.
        self._pub.setsockopt(zmq.XPUB_VERBOSER, 1)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._monitor = self._pub.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self.endpoint = bind(self._pub, endpoint)
            self.replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                # A full answer fits a client's queue; beyond it (a client asking again before it
                # read the last answer) a ROUTER drops silently unless it is told to say EAGAIN.
                self._replay.setsockopt(zmq.SNDHWM, buffer_steps + 1)
                self._replay.setsockopt(zmq.ROUTER_MANDATORY, 1)
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

    @property
    def subscribers(self) -> int:
        """Live subscriptions to the topic now (a subscriber of one topic counts once), at most
        one per connected peer; as ``wait_for_subscribers`` counts them."""
        with self._changed:
            return self._live()

    def _live(self) -> int:
        return min(self._subscriptions, len(self._peers))

    def wait_for_subscribers(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Whether ``count`` live subscribers are there within ``timeout`` seconds (ZeroMQ drops
        what a PUB sends before a subscriber's subscription arrives). One that unsubscribed, closed
        or died counts no more once ZeroMQ sees its connection close."""
        with self._changed:
            return self._changed.wait_for(lambda: self._live() >= count, timeout)

    # -- publishing --------------------------------------------------------------------------------

    def flush(self) -> int:
        """Flush the iteration's events and publish everything up to now; the next sequence
        number."""
        with self._lock:  # close() takes it too: either this completes first, or it raises
            if self.closed:
                raise ValueError("flush() on a closed EventPublisher")
            self._events.flush_iteration_events()
            self._drain()
            return self._seq

    def send(self, events: list[WireEvent]) -> int:
        """Publish ``events`` of the caller's own as one batch (say, a marker whose arrival at a
        consumer shows it has applied everything before); its sequence number."""
        with self._lock:
            if self.closed:
                raise ValueError("send() on a closed EventPublisher")
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
                self._count_subscribers()
                if self._replay is not None:
                    self._answer_replays(self._replay)

    def _count_subscribers(self) -> None:
        """With the lock held: subscriptions (``\\x01topic``) and unsubscriptions (``\\x00topic``,
        also one per topic of a subscriber that left) that reach our topic, then the peers that
        connected or left. The monitor is read second: a subscription read has its peer's
        connection announced already (accepted before it subscribed)."""
        subscriptions = self._subscriptions
        while self._pub.poll(0):
            message = self._pub.recv()
            if message[:1] in (b"\x00", b"\x01") and self._topic.startswith(message[1:]):
                # Never below 0: an XSUB may unsubscribe from what it never subscribed to.
                subscriptions = subscriptions + 1 if message[0] else max(0, subscriptions - 1)
        peers = set(self._peers)
        while self._monitor.poll(0):
            event = parse_monitor_message(self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_ACCEPTED:
                peers.add(event["value"])
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                peers.discard(event["value"])
        with self._changed:
            self._subscriptions, self._peers = subscriptions, peers
            self._changed.notify_all()

    def _answer_replays(self, replay: zmq.Socket[bytes]) -> None:
        """With the lock held: queue an answer per replay request, then send each client what its
        queue takes (never blocking: the rest waits for the next poll)."""
        while replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) < 2 or len(frames[-1]) != 8:
                continue  # not a replay request: ignored, as vLLM does
            client, start = frames[0], int.from_bytes(frames[-1], "big")
            answer = self._answers.setdefault(client, deque())
            answer.extend((seq.to_bytes(8, "big"), payload) for seq, payload in self._buffer if seq >= start)
            answer.append((END_SEQ, b""))
        for client, answer in list(self._answers.items()):
            try:
                while answer:
                    seq_bytes, payload = answer[0]
                    replay.send_multipart([client, b"", seq_bytes, payload], zmq.NOBLOCK)
                    answer.popleft()
            except zmq.Again:
                continue  # its queue is full: the client reads slowly
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                # else the client has gone: nobody to answer
            del self._answers[client]

    # -- shutdown ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Publish what is left, stop the thread and close the sockets; idempotent (a second
        caller waits for the first to finish)."""
        with self._changed:  # not the lock, which busy flush() callers may hold: this is quick
            first = not self._stop.is_set()
            self._stop.set()  # a flush() or send() under way completes; one that starts raises
        if not first:
            self._closed.wait()
            return
        self._thread.join()  # it wakes at once
        with self._lock:
            try:
                self._events.flush_iteration_events()
                self._drain()
            finally:
                self._close_sockets(self._linger_ms)

    def _close_sockets(self, linger_ms: int) -> None:
        self._pub.disable_monitor()
        self._monitor.close(linger=0)
        self._pub.close(linger=linger_ms)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
        self._closed.set()

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
