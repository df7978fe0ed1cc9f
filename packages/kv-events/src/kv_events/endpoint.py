"""Binding or connecting a ZeroMQ socket to a user's endpoint, checked strictly first, with errors
that name it.

Accepted: ``tcp://HOST:PORT`` and ``ipc://PATH``. HOST is an IPv4 address, a host or interface
name, an IPv6 address in brackets (``tcp://[::1]:5557``), or ``*`` (every interface; bind only);
PORT is a decimal 0..65535 or ``*`` (bind only: 0 and ``*`` pick a free port). ``ipc://*`` (bind
only) makes a fresh socket file. ZeroMQ itself is lax (port 99999 binds 34463, a NUL ends the
string), hence the checks: whatever is refused is a ``ValueError`` naming the endpoint.
"""

from __future__ import annotations

import errno
import ipaddress
import re
from dataclasses import dataclass

import zmq

__all__ = ["TRANSPORTS", "Endpoint", "bind", "connect", "parse"]

#: The transports served. Not ``inproc``: every publisher and subscriber owns its ZeroMQ context,
#: and an inproc endpoint is reachable from its own context only.
TRANSPORTS = ("tcp", "ipc")

# A host or interface name, or an IPv4 address (ZeroMQ resolves it; one that is not is ENODEV).
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_PORT = re.compile(r"[0-9]+")  # ASCII digits only: int() would take "+1", " 1" and other scripts' digits
_EXAMPLE = "expected e.g. tcp://127.0.0.1:5557"
# What ZeroMQ says of an address it cannot use as written: the endpoint string is wrong.
_MALFORMED = {errno.EINVAL, errno.EPROTONOSUPPORT, errno.ENODEV, zmq.EPROTONOSUPPORT}


@dataclass(frozen=True)
class Endpoint:
    """A checked endpoint: ``host`` is the tcp host (brackets removed) or the ipc path;
    ``port`` is None for ``*`` and for ipc."""

    transport: str
    host: str
    port: int | None
    ipv6: bool = False


def _bad(endpoint: str, reason: str) -> ValueError:
    return ValueError(f"endpoint {endpoint!r}: {reason} ({_EXAMPLE})")


def parse(endpoint: str, *, for_bind: bool) -> Endpoint:
    """``endpoint`` checked; a ``ValueError`` naming it says what is wrong."""
    if not isinstance(endpoint, str):
        raise TypeError(f"endpoint: expected a str, got {type(endpoint).__name__}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in endpoint):
        raise _bad(endpoint, "contains a control character")
    transport, sep, address = endpoint.partition("://")
    if not sep:
        raise _bad(endpoint, "no transport (TRANSPORT://ADDRESS)")
    if transport not in TRANSPORTS:
        supported = ", ".join(f"{t}://" for t in TRANSPORTS)
        raise _bad(endpoint, f"unsupported transport {transport!r} (supported: {supported})")
    if transport == "ipc":
        if not address or (address == "*" and not for_bind):
            raise _bad(endpoint, "no socket path" if not address else "ipc://* binds only")
        return Endpoint(transport, address, None)
    host, port = _split_host_port(endpoint, address)
    ipv6 = host.startswith("[")
    if ipv6:
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _bad(endpoint, f"{host!r} in brackets is not an IPv6 address") from None
    elif host == "*":
        if not for_bind:
            raise _bad(endpoint, "host '*' binds only")
    elif not _NAME.fullmatch(host):
        hint = " (an IPv6 address goes in brackets: tcp://[::1]:5557)" if ":" in host else ""
        raise _bad(endpoint, f"host {host!r} is not an address or a name{hint}")
    return Endpoint(transport, host, _port(endpoint, port, for_bind), ipv6)


def _split_host_port(endpoint: str, address: str) -> tuple[str, str]:
    """``HOST:PORT`` split at the colon that ends the host (after a bracketed IPv6 address)."""
    if address.startswith("["):
        close = address.find("]")
        if close < 0 or address[close + 1 : close + 2] != ":":
            raise _bad(endpoint, "expected [IPV6]:PORT")
        return address[: close + 1], address[close + 2 :]
    host, sep, port = address.rpartition(":")
    if not sep:
        raise _bad(endpoint, "no port (HOST:PORT)")
    if not host:
        raise _bad(endpoint, "no host (HOST:PORT)")
    return host, port


def _port(endpoint: str, port: str, for_bind: bool) -> int | None:
    if port == "*":
        if not for_bind:
            raise _bad(endpoint, "port '*' binds only")
        return None
    if not _PORT.fullmatch(port) or int(port) > 65535:
        raise _bad(endpoint, f"port {port!r} is not an integer in 0..65535 or '*'")
    if int(port) == 0 and not for_bind:
        raise _bad(endpoint, "port 0 binds only")
    return int(port)


def _prepare(socket: zmq.Socket[bytes], endpoint: str, for_bind: bool) -> None:
    if parse(endpoint, for_bind=for_bind).ipv6:
        socket.setsockopt(zmq.IPV6, 1)  # else ZeroMQ does not take an IPv6 address (ENODEV)


def _error(endpoint: str, exc: zmq.ZMQError) -> Exception:
    if exc.errno in _MALFORMED:
        return _bad(endpoint, exc.strerror)
    return OSError(exc.errno, f"endpoint {endpoint!r}: {exc.strerror}")


def bind(socket: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind ``socket``; the endpoint actually bound (a ``*`` port resolved). A bad address is a
    ``ValueError``, a busy or unavailable one an ``OSError``; both name the endpoint."""
    _prepare(socket, endpoint, True)
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as exc:
        raise _error(endpoint, exc) from None
    bound = socket.getsockopt(zmq.LAST_ENDPOINT)
    return bound.decode() if isinstance(bound, bytes) else str(bound)


def connect(socket: zmq.Socket[bytes], endpoint: str) -> None:
    """Connect ``socket`` (ZeroMQ connects lazily: only the address is checked here)."""
    _prepare(socket, endpoint, False)
    try:
        socket.connect(endpoint)
    except zmq.ZMQError as exc:
        raise _error(endpoint, exc) from None
