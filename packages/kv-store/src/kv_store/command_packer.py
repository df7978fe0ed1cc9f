"""``RedisBlockStore``'s commands on the wire (RESP): packed with the values by reference, and sent
with scatter-gather writes. The client packs each command into one new ``bytes`` object, a copy of
its 64 KiB value whose pages, under glibc's heap trimming, are faulted in afresh on every batch:
sending the caller's bytes as they are copies nothing."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Sequence

__all__ = ["pack", "send"]

_BY_REFERENCE = 4096  # arguments at least this long are sent from where they are
_MAX_PARTS = 512  # buffers per sendmsg (the kernel takes at most IOV_MAX = 1024)

Part = bytes | bytearray | memoryview


def _encode(arg: object) -> bytes | memoryview:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, bytearray | memoryview):
        return memoryview(arg).cast("B")
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int | float):
        return repr(arg).encode()
    raise TypeError(f"cannot send a {type(arg).__name__} to the server")


def pack(commands: Sequence[Sequence[object]]) -> list[Part]:
    """The buffers that make up ``commands`` on the wire, in order: short pieces joined, long
    arguments (values) the caller's own objects, not copied."""
    parts: list[Part] = []
    small = bytearray()
    for command in commands:
        small += b"*%d\r\n" % len(command)
        for arg in command:
            # the common types first, inline: a put packs a dozen arguments per block
            data = arg if type(arg) is bytes else b"%d" % arg if type(arg) is int else _encode(arg)
            if len(data) >= _BY_REFERENCE:
                small += b"$%d\r\n" % len(data)
                parts += [bytes(small), data]
                small = bytearray(b"\r\n")
            else:
                small += b"$%d\r\n%s\r\n" % (len(data), data)
    if small:
        parts.append(bytes(small))
    return parts


def send(sock: socket.socket, parts: Sequence[Part]) -> None:
    """Write every byte of ``parts`` to ``sock``: scatter-gather where the socket has it, one
    write per part on TLS (the record layer copies anyway)."""
    if isinstance(sock, ssl.SSLSocket) or not hasattr(sock, "sendmsg"):
        for part in parts:
            sock.sendall(part)
        return
    views = [memoryview(p).cast("B") for p in parts]
    first = 0
    while first < len(views):
        sent = sock.sendmsg(views[first : first + _MAX_PARTS])
        while first < len(views) and sent >= len(views[first]):  # the buffers written whole
            sent -= len(views[first])
            first += 1
        if sent:
            views[first] = views[first][sent:]
