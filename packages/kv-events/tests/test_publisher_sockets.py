"""The publisher's sockets under load and races (docs/events.md): a replay answers every buffered
batch however many there are, ``close()`` racing ``flush()``/``send()`` gives the documented error
and nothing else, and ``wait_for_subscribers`` counts live subscribers only."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import zmq
from publisher_stub import StubEvents, publisher

from kv_events import EventPublisher, EventSubscriber
from kv_events.publisher import END_SEQ
from kv_events.wire import AllBlocksCleared, BlockStored, WireEvent, decode_batch

#: A batch of 10 KiB, as a long prefill's blocks make: 3,000 of them are more than the kernel's
#: socket buffers hold, so what the client does not read yet waits in the publisher's queue.
BATCH: list[WireEvent] = [BlockStored([1, 2], None, list(range(100_000, 102_048)), 256, None, "GPU")]


def ask_replay(endpoint: str, start: int, requests: int = 1) -> list[list[int]]:
    """The sequence numbers of each answer to ``requests`` requests from ``start``, sent at once
    and read only once the publisher had time to answer them all (what a slow reader sees)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 100)  # a client that queues little
    try:
        dealer.connect(endpoint)
        for _ in range(requests):
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
        time.sleep(0.3)
        answers: list[list[int]] = [[]]
        while len(answers) <= requests:
            assert dealer.poll(5000), f"the answer stopped after {[len(a) for a in answers]} batches"
            _empty, seq, payload = dealer.recv_multipart()
            if seq == END_SEQ:
                answers.append([])
            else:
                assert decode_batch(payload).events == BATCH
                answers[-1].append(int.from_bytes(seq, "big"))
        return answers[:-1]
    finally:
        dealer.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("requests", [1, 2])
def test_a_late_subscriber_gets_every_buffered_batch(requests: int) -> None:
    """3,000 batches are past ZeroMQ's default high-water mark (1,000), where a ROUTER drops
    silently; two requests at once ask for twice the buffer."""
    with publisher(buffer_steps=3000) as pub:
        for _ in range(3000):
            pub.send(BATCH)
        assert pub.replay_endpoint is not None
        assert ask_replay(pub.replay_endpoint, 0, requests) == [list(range(3000))] * requests
        assert ask_replay(pub.replay_endpoint, 2990) == [list(range(2990, 3000))]


def race(pub_close: Callable[[], None], calls: list[Callable[[], int]]) -> list[BaseException]:
    """Run each of ``calls`` in a loop on a thread until it raises, ``pub_close`` meanwhile; what
    they raised other than the documented ``ValueError``."""
    start = threading.Barrier(len(calls) + 1)
    errors: list[BaseException] = []

    def loop(call: Callable[[], int]) -> None:
        start.wait()
        deadline = time.monotonic() + 10  # calling until close() takes effect, on a busy machine too
        while time.monotonic() < deadline:
            try:
                call()
            except ValueError as exc:
                if "on a closed EventPublisher" not in str(exc):
                    errors.append(exc)
                return
            except Exception as exc:  # noqa: BLE001 - anything else is the defect (a raw ZMQError)
                errors.append(exc)
                return
        errors.append(AssertionError("close() never took effect"))

    threads = [threading.Thread(target=loop, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    start.wait()
    time.sleep(0.002)  # they are calling by now
    pub_close()
    for thread in threads:
        thread.join(10)
    return errors


def test_close_racing_flush_and_send_gives_the_documented_error() -> None:
    for _ in range(60):
        with publisher(StubEvents(delay=0.001), replay_endpoint=None, linger_ms=0) as pub:
            assert race(pub.close, [pub.flush, pub.flush, lambda: pub.send([AllBlocksCleared()])]) == []


def test_a_flush_under_way_when_close_is_called_completes() -> None:
    events = StubEvents()
    pub = publisher(events, replay_endpoint=None)
    events.hold = release = threading.Event()
    flushed: list[int | Exception] = []

    def flush() -> None:
        try:
            flushed.append(pub.flush())
        except Exception as exc:  # noqa: BLE001 - the outcome, checked below
            flushed.append(exc)

    flusher = threading.Thread(target=flush)
    flusher.start()
    assert events.entered.wait(5)  # the flush is in the event manager now
    closer = threading.Thread(target=pub.close)
    closer.start()
    time.sleep(0.05)  # close() waits for it (before the fix: closed the sockets under it)
    release.set()
    flusher.join(5)
    closer.join(5)
    assert pub.closed and not closer.is_alive()
    assert len(flushed) == 1 and isinstance(flushed[0], int), flushed
    with pytest.raises(ValueError, match=r"^flush\(\) on a closed EventPublisher$"):
        pub.flush()
    with pytest.raises(ValueError, match=r"^send\(\) on a closed EventPublisher$"):
        pub.send([])


SUBSCRIBER = """
import sys, time, zmq
sub = zmq.Context().socket(zmq.SUB)
sub.connect(sys.argv[1])
sub.setsockopt(zmq.SUBSCRIBE, b"")
print("subscribed", flush=True)
time.sleep(60)
"""


def left(pub: EventPublisher, count: int, within: float = 5.0) -> bool:
    """Whether ``wait_for_subscribers(count)`` turns False within ``within`` seconds (ZeroMQ
    notices a peer's departure when its connection closes)."""
    deadline = time.monotonic() + within
    while pub.wait_for_subscribers(count, 0.0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return not pub.wait_for_subscribers(count, 0.1)


def test_a_killed_subscriber_is_not_counted() -> None:
    with publisher(replay_endpoint=None) as pub:
        child = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, pub.endpoint], stdout=subprocess.PIPE)
        try:
            assert child.stdout is not None and child.stdout.readline() == b"subscribed\n"
            assert pub.wait_for_subscribers(1, 10)
            with EventSubscriber(pub.endpoint):  # a second, live one
                assert pub.wait_for_subscribers(2, 10)
                child.send_signal(signal.SIGKILL)  # it sends no unsubscription
                child.wait(5)
                assert left(pub, 2)
                assert pub.wait_for_subscribers(1, 0) and pub.subscribers == 1
            assert left(pub, 1)
            assert pub.subscribers == 0
        finally:
            child.kill()
            child.wait()


def test_a_subscriber_that_closes_or_unsubscribes_is_not_counted() -> None:
    with publisher(replay_endpoint=None, topic="kv") as pub:
        with EventSubscriber(pub.endpoint, topic="kv"):
            assert pub.wait_for_subscribers(1, 10)
        assert left(pub, 1)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        try:
            sub.connect(pub.endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"other")  # not our topic: it hears nothing of ours
            assert not pub.wait_for_subscribers(1, 0.2)
            sub.setsockopt(zmq.SUBSCRIBE, b"k")  # a prefix of it: it hears ours
            assert pub.wait_for_subscribers(1, 10)
            sub.setsockopt(zmq.SUBSCRIBE, b"kv")
            assert not pub.wait_for_subscribers(2, 0.2)  # one subscriber still
            sub.setsockopt(zmq.UNSUBSCRIBE, b"k")
            sub.setsockopt(zmq.UNSUBSCRIBE, b"kv")
            assert left(pub, 1)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.setsockopt(zmq.SUBSCRIBE, b"")  # twice: ZeroMQ passes both, but one unsubscription
            assert pub.wait_for_subscribers(1, 10)
            assert not pub.wait_for_subscribers(2, 0.2)
        finally:
            sub.close(linger=0)
            ctx.term()
        assert left(pub, 1)
