"""command_packer: the bytes on the wire are the client's own packing of the same commands, long
values are sent from the caller's objects, and ``send`` writes every byte through partial writes."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_store.command_packer import Command, Sets, command_count, pack, send, unpacked

hiredis = pytest.importorskip("hiredis")

args_st = st.one_of(st.binary(max_size=9000), st.text(max_size=20), st.integers(-(2**40), 2**40))


@settings(max_examples=200, deadline=None)
@given(commands=st.lists(st.lists(args_st, min_size=1, max_size=5), min_size=1, max_size=6))
def test_packing_is_the_clients(commands: list[list[object]]) -> None:
    parts = pack(commands)
    assert b"".join(bytes(p) for p in parts) == b"".join(hiredis.pack_command(tuple(c)) for c in commands)
    long = [a for c in commands for a in c if isinstance(a, bytes) and len(a) >= 4096]
    assert [p for p in parts if any(p is a for a in long)] == long  # by reference, not copied


@settings(max_examples=100, deadline=None)
@given(
    before=st.lists(st.lists(args_st, min_size=1, max_size=4), max_size=3),
    blocks=st.lists(st.tuples(st.binary(min_size=1, max_size=80), st.binary(max_size=9000)), max_size=6),
    tail=st.sampled_from([(), (b"NX",), (b"NX", b"PX", b"1500")]),
    after=st.lists(st.lists(args_st, min_size=1, max_size=4), max_size=2),
)
def test_sets_pack_as_their_commands(
    before: list[list[object]], blocks: list[tuple[bytes, bytes]], tail: tuple[bytes, ...], after: list[list[object]]
) -> None:
    """A ``Sets`` among other commands: on the wire the client's packing of its SET commands,
    each value sent from the caller's object; one reply per key."""
    sets = Sets([k for k, _ in blocks], [v for _, v in blocks], tail)
    commands: list[Command] = [*before, sets, *after]
    flat = unpacked(commands)
    assert flat == [*before, *([b"SET", k, v, *tail] for k, v in blocks), *after]
    assert command_count(commands) == len(flat)
    parts = pack(commands)
    assert b"".join(bytes(p) for p in parts) == b"".join(hiredis.pack_command(tuple(c)) for c in flat)
    assert all(any(p is v for p in parts) for _, v in blocks if v)


def test_floats_and_buffers() -> None:
    view = memoryview(bytearray(b"v" * 5000))
    wire = b"".join(bytes(p) for p in pack([["EVALSHA", 1.5, view]]))
    assert wire == b"*3\r\n$7\r\nEVALSHA\r\n$3\r\n1.5\r\n$5000\r\n" + b"v" * 5000 + b"\r\n"
    with pytest.raises(TypeError, match="cannot send a NoneType"):
        pack([["SET", None]])


def test_send_writes_every_byte_through_partial_writes() -> None:
    values = [os.urandom(70_000) for _ in range(700)]  # more parts than one sendmsg takes
    parts = pack([["SET", b"k%d" % i, v] for i, v in enumerate(values)])
    expected = b"".join(bytes(p) for p in parts)
    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # many short writes
    left.settimeout(10)  # as the client sets it: a write may then send only part
    got = bytearray()

    def drain() -> None:
        while chunk := right.recv(1 << 16):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    send(left, parts)
    left.shutdown(socket.SHUT_WR)
    reader.join(timeout=30)
    left.close()
    right.close()
    assert bytes(got) == expected
