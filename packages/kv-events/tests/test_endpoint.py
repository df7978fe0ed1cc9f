"""Endpoints (kv_events.endpoint, docs/events.md): what binds and connects, and what is refused
with a ValueError naming the endpoint (ZeroMQ alone takes port 99999 as 34463 and stops at a
NUL)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from publisher_stub import publisher

from kv_events import EventSubscriber
from kv_events.endpoint import bind, connect
from kv_events.wire import AllBlocksCleared


def ipv6_loopback() -> str | None:
    """Why IPv6 loopback cannot be used here, or None if it can."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        return f"no IPv6 loopback on this machine ({exc})"
    return None


needs_ipv6 = pytest.mark.skipif(ipv6_loopback() is not None, reason=str(ipv6_loopback()))


@pytest.fixture
def xpub() -> Iterator[zmq.Socket[bytes]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    s = ctx.socket(zmq.XPUB)
    yield s
    s.close(linger=0)
    ctx.term()


BAD = [
    ("tcp://127.0.0.1:99999", "port '99999' is not an integer in 0..65535"),
    ("tcp://127.0.0.1:65536", "port '65536'"),
    ("tcp://127.0.0.1:-1", "port '-1'"),
    ("tcp://127.0.0.1:", "port ''"),
    ("tcp://127.0.0.1:+5557", "port '+5557'"),
    ("tcp://127.0.0.1:55a7", "port '55a7'"),
    ("tcp://127.0.0.1: 5557", "port ' 5557'"),
    ("tcp://127.0.0.1:\u0665\u0665", "port"),  # Arabic-Indic digits: int() takes them
    ("tcp://127.0.0.1:5557\x00", "control character"),
    ("tcp://127.0.0.1\x00:5557", "control character"),
    ("tcp://127.0.0.1:5557\n", "control character"),
    ("tcp://127.0.0.1:5557\x7f", "control character"),
    ("udp://127.0.0.1:5557", "unsupported transport 'udp' (supported: tcp://, ipc://)"),
    ("inproc://events", "unsupported transport 'inproc'"),
    ("bogus://x", "unsupported transport 'bogus'"),
    ("TCP://127.0.0.1:5557", "unsupported transport 'TCP'"),
    ("nonsense", "no transport"),
    ("127.0.0.1:5557", "no transport"),
    ("tcp://127.0.0.1", "no port"),
    ("tcp://:5557", "no host"),
    ("tcp://::1:5557", "an IPv6 address goes in brackets"),
    ("tcp://[::1]", "expected [IPV6]:PORT"),
    ("tcp://[::1:5557", "expected [IPV6]:PORT"),
    ("tcp://[::1]5557", "expected [IPV6]:PORT"),
    ("tcp://[127.0.0.1]:5557", "'127.0.0.1' in brackets is not an IPv6 address"),
    ("tcp://[nohost]:5557", "in brackets is not an IPv6 address"),
    ("tcp://local host:5557", "host 'local host' is not an address or a name"),
    ("tcp://a;b:5557", "host 'a;b'"),
    ("ipc://", "no socket path"),
]


@pytest.mark.parametrize(("endpoint", "reason"), BAD)
def test_a_bad_endpoint_is_refused_naming_it(xpub: zmq.Socket[bytes], endpoint: str, reason: str) -> None:
    for call in (bind, connect):
        with pytest.raises(ValueError) as info:
            call(xpub, endpoint)
        message = str(info.value)
        assert message.startswith(f"endpoint {endpoint!r}: ") and reason in message, message
        assert "\n" not in message
    assert xpub.getsockopt(zmq.LAST_ENDPOINT) == b""  # nothing was bound


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("tcp://*:5557", "host '*' binds only"),
        ("tcp://127.0.0.1:*", "port '*' binds only"),
        ("tcp://127.0.0.1:0", "port 0 binds only"),
        ("ipc://*", "ipc://* binds only"),
    ],
)
def test_a_wildcard_is_for_bind_only(xpub: zmq.Socket[bytes], endpoint: str, reason: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(f"endpoint {endpoint!r}: {reason} (expected e.g. ")):
        connect(xpub, endpoint)


def test_the_publisher_refuses_a_bad_endpoint_before_binding() -> None:
    with pytest.raises(ValueError, match=r"^endpoint 'tcp://127.0.0.1:99999': port"):
        publisher(replay_endpoint="tcp://127.0.0.1:99999")
    with pytest.raises(ValueError, match=r"^endpoint 'udp://127.0.0.1:5557': unsupported transport"):
        EventSubscriber("udp://127.0.0.1:5557")


def free_port(family: socket.AddressFamily, host: str) -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize(
    ("endpoint", "bound"),
    [
        ("tcp://127.0.0.1:*", r"tcp://127\.0\.0\.1:\d+"),
        ("tcp://127.0.0.1:0", r"tcp://127\.0\.0\.1:\d+"),
        ("tcp://localhost:*", r"tcp://127\.0\.0\.1:\d+"),
        ("tcp://127.0.0.1:PORT", r"tcp://127\.0\.0\.1:PORT"),
        ("ipc://*", r"ipc://.+"),
        pytest.param("tcp://[::1]:*", r"tcp://\[::1\]:\d+", marks=needs_ipv6),
        pytest.param("tcp://[::1]:PORT", r"tcp://\[::1\]:PORT", marks=needs_ipv6),
    ],
)
def test_a_good_endpoint_binds_and_says_where(xpub: zmq.Socket[bytes], endpoint: str, bound: str) -> None:
    if "PORT" in endpoint:
        port = str(free_port(socket.AF_INET6, "::1") if "[" in endpoint else free_port(socket.AF_INET, "127.0.0.1"))
        endpoint, bound = endpoint.replace("PORT", port), bound.replace("PORT", port)
    got = bind(xpub, endpoint)
    assert got == xpub.getsockopt_string(zmq.LAST_ENDPOINT)
    assert re.fullmatch(bound, got), got
    assert not got.endswith(":0")


def test_an_ipc_path_binds(xpub: zmq.Socket[bytes], tmp_path: Path) -> None:
    path = f"ipc://{tmp_path}/events.sock"
    assert bind(xpub, path) == path


@pytest.mark.parametrize("endpoint", [pytest.param("tcp://[::1]:*", marks=needs_ipv6), "ipc://*"])
def test_events_and_replay_flow(endpoint: str) -> None:
    with publisher(endpoint=endpoint, replay_endpoint=endpoint) as pub:
        for bound in (pub.endpoint, pub.replay_endpoint):  # the real endpoints: a port, a path
            assert bound is not None and bound.startswith(endpoint[:-1]) and bound != endpoint
        first = pub.send([AllBlocksCleared()])  # before anyone listens: by replay only
        with EventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, from_seq=first) as sub:
            assert pub.wait_for_subscribers(1, 10)
            last = pub.send([AllBlocksCleared()])
            got = [sub.receive(5000), sub.receive(5000)]
            assert [g[0] if g else None for g in got] == [first, last]
