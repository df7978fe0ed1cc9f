"""``RedisBlockStore``'s commands on the wire (RESP): packed with the values by reference, and sent
with scatter-gather writes. The client packs each command into one new ``bytes`` object, a copy of
its 64 KiB value whose pages, under glibc's heap trimming, are faulted in afresh on every batch:
sending the caller's bytes as they are copies nothing."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Sets", "command_count", "pack", "send", "unpacked"]

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


@dataclass(frozen=True)
class Sets:
    """``SET key value *tail`` for each of ``keys`` / ``values``, as one item of a command list: a
    put's commands packed without a loop over their arguments (a decode writes a block at a
    time, and the writer's time holds the GIL the engine's thread wants)."""

    keys: Sequence[bytes]
    values: Sequence[bytes]
    tail: tuple[bytes, ...] = ()

    def commands(self) -> list[list[bytes]]:
        return [[b"SET", key, value, *self.tail] for key, value in zip(self.keys, self.values, strict=True)]

    def parts(self) -> list[Part]:
        head = b"*%d\r\n$3\r\nSET\r\n$%%d\r\n%%b\r\n$%%d\r\n" % (3 + len(self.tail))
        tail = b"\r\n" + b"".join(b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in self.tail)
        parts: list[Part] = []
        for key, value in zip(self.keys, self.values, strict=True):
            parts += (head % (len(key), key, len(value)), value, tail)  # the value by reference
        return parts


Command = Sequence[object] | Sets


def command_count(commands: Sequence[Command]) -> int:
    """How many replies ``commands`` get."""
    return sum(len(c.keys) if isinstance(c, Sets) else 1 for c in commands)


def unpacked(commands: Sequence[Command]) -> list[Sequence[object]]:
    """``commands`` with each ``Sets`` as its ``SET`` commands (for the client's own packing)."""
    out: list[Sequence[object]] = []
    for command in commands:
        if isinstance(command, Sets):
            out += command.commands()
        else:
            out.append(command)
    return out


def pack(commands: Sequence[Command]) -> list[Part]:
    """The buffers that make up ``commands`` on the wire, in order: short pieces joined, long
    arguments (values) the caller's own objects, not copied."""
    parts: list[Part] = []
    small = bytearray()
    for command in commands:
        if isinstance(command, Sets):
            if small:
                parts.append(bytes(small))
                small = bytearray()
            parts += command.parts()
            continue
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
    """Write every byte of ``parts`` to ``sock``: scatter-gather where the socket has it; on TLS
    (the record layer copies anyway) runs of short parts joined, one write each."""
    if isinstance(sock, ssl.SSLSocket) or not hasattr(sock, "sendmsg"):
        for chunk in _joined(parts):
            sock.sendall(chunk)
        return
    views = [p if type(p) is bytes else memoryview(p).cast("B") for p in parts]  # len() in bytes
    left = sum(map(len, views))
    first = 0
    while first < len(views):
        sent = sock.sendmsg(views[first : first + _MAX_PARTS])
        left -= sent
        if not left:
            return  # the common case: one write took it all
        while first < len(views) and sent >= len(views[first]):  # the buffers written whole
            sent -= len(views[first])
            first += 1
        if sent:
            views[first] = memoryview(views[first]).cast("B")[sent:]


def _joined(parts: Sequence[Part]) -> list[Part]:
    """``parts`` with runs of short ones joined (a TLS record per write: not one per key)."""
    out: list[Part] = []
    run: list[Part] = []
    size = 0
    for part in parts:
        if len(part) >= _BY_REFERENCE:
            if run:
                out.append(b"".join(run))
                run, size = [], 0
            out.append(part)
            continue
        run.append(part)
        size += len(part)
        if size >= 16 * _BY_REFERENCE:
            out.append(b"".join(run))
            run, size = [], 0
    if run:
        out.append(b"".join(run))
    return out
