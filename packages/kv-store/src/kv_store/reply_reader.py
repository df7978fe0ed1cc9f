"""``RedisBlockStore``'s read of the server's replies off a connection's socket (RESP2 and RESP3;
a RESP3 push between replies is read and dropped): an MGET's values go straight from the socket into the caller's buffers. The client's own
parser makes a ``bytes`` object of each value, which the store then copies; under glibc's
default heap trimming those values' pages are given back to the kernel after every batch and
faulted in again on the next, which made a read of 64 KiB blocks 2.5x a plain MGET
(docs/performance.md). Reading into the buffers allocates nothing per value and copies once."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

__all__ = ["BulkResult", "ReplyReader"]

_SCRATCH = 16 << 10  # header lines, and the first bytes of a value that arrive with its header
_OK = b"+OK\r\n"


class ProtocolError(ConnectionError):
    """A reply this reader cannot follow: the connection is out of step and must be dropped."""


class BulkResult:
    """What ``ReplyReader.bulks_into`` did: values copied (from the first, up to the first one
    missing or of the wrong size), their bytes, and whether a value of the wrong size stopped it."""

    __slots__ = ("bad", "copied", "nbytes", "stopped")

    def __init__(self) -> None:
        self.copied = self.nbytes = 0
        self.bad = self.stopped = False

    def accept(self, size: int, want: int) -> bool:
        """Whether the next value, ``size`` bytes (-1: missing), goes into its ``want``-byte
        buffer: from the first, while they are there and of their buffer's size (counted); the
        first one present but of another size is a bad value."""
        if self.stopped or size != want or size < 0:
            self.bad |= not self.stopped and size >= 0
            self.stopped = True
            return False
        self.copied += 1
        self.nbytes += size
        return True


class ReplyReader:
    """Reads whole replies, one after another, from ``sock`` (blocking, with its own timeout).
    After any exception the connection is out of step: its owner must close it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray(_SCRATCH)
        self._start = self._end = 0  # the bytes read but not yet consumed

    def bulks_into(self, buffers: Sequence[memoryview], errors: dict[str, type[Exception]]) -> BulkResult:
        """An array of bulk strings (an MGET's reply), each into its buffer (1-D, bytes) while they
        are there and of their buffer's size; the rest are read and dropped. An error reply raises
        (``errors``: its first word to its class, ``""`` the default)."""
        head = self._head()
        if head[:1] == b"-":
            raise _error(head, errors)
        count = self._count(head, b"*")
        if count != len(buffers):
            raise ProtocolError(f"{count} values for {len(buffers)} keys")
        result = BulkResult()
        for buffer in buffers:
            line = self._line()
            size = -1 if line == b"_" else self._count(line, b"$")
            if result.accept(size, buffer.nbytes):
                self._into(buffer)
            elif size >= 0:
                self._skip(size)  # the stream goes on to the next value
            if size >= 0:
                self._crlf()
        return result

    def replies(self, count: int, errors: dict[str, type[Exception]]) -> list[Any]:
        """The next ``count`` replies (``reply``); a run of ``+OK`` (a put's SETs) read at once."""
        out: list[Any] = []
        while len(out) < count:
            run = self._oks(count - len(out))
            out += [b"OK"] * run
            if len(out) < count:
                out.append(self.reply(errors))
        return out

    def _oks(self, most: int) -> int:
        """Consume the ``+OK`` replies at the start of what is read, at most ``most``; how many."""
        width, start = len(_OK), self._start
        limit = min(most, (self._end - start) // width)  # the bytes after _end are stale
        run = limit
        if self._buffer[start : start + run * width] != _OK * run:
            run = 0
            while run < limit and self._buffer[start + run * width : start + (run + 1) * width] == _OK:
                run += 1
        self._start += run * width
        return run

    def reply(self, errors: dict[str, type[Exception]]) -> Any:
        """The next reply: int, float, bool, bytes, None, a list of them (maps as lists of keys
        and values), or an error reply as an exception instance (not raised)."""
        return self._value(self._head(), errors)

    def _head(self) -> bytes:
        """The first line of the next reply, after any push (RESP3: not a reply to a command)."""
        line = self._line()
        while line[:1] == b">":
            self._value(line, {"": ProtocolError})
            line = self._line()
        return line

    def _value(self, line: bytes, errors: dict[str, type[Exception]]) -> Any:
        kind, rest = line[:1], line[1:]
        if kind in (b":", b"("):
            return int(rest)
        if kind == b",":
            return float(rest)
        if kind == b"#":
            return rest == b"t"
        if kind == b"+":
            return bytes(rest)
        if kind == b"-":
            return _error(line, errors)
        if kind == b"_":
            return None
        if kind in (b"$", b"=", b"!"):
            size = self._count(line, kind)
            if size < 0:
                return None
            value = bytearray(size)
            self._into(memoryview(value))
            self._crlf()
            return _error(b"-" + value, errors) if kind == b"!" else bytes(value)
        if kind in (b"*", b"~", b">", b"%", b"|"):
            count = self._count(line, kind) * (2 if kind in (b"%", b"|") else 1)
            items = [self._value(self._line(), errors) for _ in range(max(0, count))]
            if kind == b"|":  # attributes describe the reply after them
                return self.reply(errors)
            return None if count < 0 else items
        raise ProtocolError(f"unexpected reply type {kind!r}")

    # -- bytes off the socket -----------------------------------------------------------------------

    def _fill(self) -> None:
        """Read what the socket has into the scratch buffer, after what is left of it."""
        if self._start:
            left = self._end - self._start
            self._buffer[:left] = self._buffer[self._start : self._end]
            self._start, self._end = 0, left
        if self._end == len(self._buffer):
            self._buffer.extend(bytes(len(self._buffer)))  # a line longer than the buffer
        got = self._sock.recv_into(memoryview(self._buffer)[self._end :])
        if got == 0:
            raise ConnectionError("the server closed the connection")
        self._end += got

    def _line(self) -> bytes:
        while True:
            end = self._buffer.find(b"\r\n", self._start, self._end)
            if end >= 0:
                line = bytes(self._buffer[self._start : end])
                self._start = end + 2
                return line
            self._fill()

    def _into(self, view: memoryview) -> None:
        """Exactly ``len(view)`` bytes into ``view``: what the scratch holds, then off the socket."""
        have = min(len(view), self._end - self._start)
        view[:have] = self._buffer[self._start : self._start + have]
        self._start += have
        while have < len(view):
            got = self._sock.recv_into(view[have:])
            if got == 0:
                raise ConnectionError("the server closed the connection")
            have += got

    def _skip(self, size: int) -> None:
        while size > 0:
            if self._start == self._end:
                self._start = self._end = 0
                self._fill()
            step = min(size, self._end - self._start)
            self._start += step
            size -= step

    def _crlf(self) -> None:
        while self._end - self._start < 2:
            self._fill()
        if self._buffer[self._start : self._start + 2] != b"\r\n":
            raise ProtocolError("a value not followed by CRLF")
        self._start += 2

    @staticmethod
    def _count(line: bytes, kind: bytes) -> int:
        if line[:1] != kind:
            raise ProtocolError(f"expected {kind!r}, got {line[:16]!r}")
        try:
            return int(line[1:])
        except ValueError:
            raise ProtocolError(f"bad length {line[:16]!r}") from None


def _error(line: bytes, errors: dict[str, type[Exception]]) -> Exception:
    message = line[1:].decode("utf-8", "replace")
    return errors.get(message.split(" ", 1)[0], errors[""])(message)
