"""Binding a ZeroMQ socket to a user's endpoint, with errors that name it."""

from __future__ import annotations

import errno

import zmq

__all__ = ["bind", "connect"]

# A malformed address, an unknown transport or host: the endpoint string itself is wrong.
_MALFORMED = {errno.EINVAL, errno.EPROTONOSUPPORT, errno.ENODEV, zmq.EPROTONOSUPPORT}


def _error(endpoint: str, exc: zmq.ZMQError) -> Exception:
    if exc.errno in _MALFORMED:
        return ValueError(f"endpoint {endpoint!r}: {exc.strerror} (expected e.g. tcp://127.0.0.1:5557)")
    return OSError(exc.errno, f"endpoint {endpoint!r}: {exc.strerror}")


def bind(socket: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind ``socket``; the endpoint actually bound (a ``*`` port resolved). A bad address is a
    ``ValueError``, a busy or unavailable one an ``OSError``; both name the endpoint."""
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as exc:
        raise _error(endpoint, exc) from None
    bound = socket.getsockopt(zmq.LAST_ENDPOINT)
    return bound.decode() if isinstance(bound, bytes) else str(bound)


def connect(socket: zmq.Socket[bytes], endpoint: str) -> None:
    """Connect ``socket`` (ZeroMQ connects lazily: only the address is checked here)."""
    try:
        socket.connect(endpoint)
    except zmq.ZMQError as exc:
        raise _error(endpoint, exc) from None
