"""ReplyReader: replies read off the socket in any fragmentation, values straight into buffers,
the stream left in step for the reply after; and the store's reads through it on a real server,
with each protocol and through the client's own parser."""

from __future__ import annotations

import pytest
import redis
from block_chains import buffers_for, make_chain
from hypothesis import given, settings
from hypothesis import strategies as st

from kv_store.redis_block_store import RedisBlockStore
from kv_store.reply_reader import ProtocolError, ReplyReader
from kv_store.valkey_server import ValkeyServer

pytest_plugins = ["store_fixtures"]

ERRORS: dict[str, type[Exception]] = {"NOSCRIPT": redis.exceptions.NoScriptError, "": redis.exceptions.ResponseError}


class Chunked:
    """A socket's ``recv_into`` that hands out ``data`` in the given chunk sizes (then the rest)."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data, self.sizes, self.at = data, sizes, 0

    def recv_into(self, view: memoryview) -> int:
        size = self.sizes.pop(0) if self.sizes else len(self.data)
        take = min(len(view), size, len(self.data) - self.at)
        view[:take] = self.data[self.at : self.at + take]
        self.at += take
        return take


def bulk(value: bytes | None, resp3: bool) -> bytes:
    if value is None:
        return b"_\r\n" if resp3 else b"$-1\r\n"
    return b"$%d\r\n%s\r\n" % (len(value), value)


values_st = st.lists(st.one_of(st.none(), st.binary(max_size=40_000)), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(
    values=values_st,
    sizes=st.lists(st.integers(1, 70_000), max_size=40),
    resp3=st.booleans(),
    push=st.booleans(),
    expected=st.integers(0, 40_000),
)
def test_bulks_into_any_fragmentation(
    values: list[bytes | None], sizes: list[int], resp3: bool, push: bool, expected: int
) -> None:
    """Values of the buffer's size are copied from the first up to the first one missing or of
    another size; the integers after them are the next reply, whatever the chunks."""
    data = b">2\r\n$7\r\nmessage\r\n:1\r\n" if push else b""
    data += b"*%d\r\n" % len(values) + b"".join(bulk(v, resp3) for v in values)
    data += b"*3\r\n:1\r\n:-2\r\n:3\r\n"
    buffers = [memoryview(bytearray(expected)) for _ in values]
    reader = ReplyReader(Chunked(data, sizes))  # type: ignore[arg-type]
    result = reader.bulks_into(buffers, ERRORS)
    good = 0
    while good < len(values) and values[good] is not None and len(values[good] or b"") == expected:
        good += 1
    assert result.copied == good
    assert [bytes(b) for b in buffers[:good]] == values[:good]
    assert result.nbytes == good * expected
    assert result.bad == (good < len(values) and values[good] is not None)
    assert reader.reply(ERRORS) == [1, -2, 3]


SET_REPLIES = {"ok": b"+OK\r\n", "nil": b"$-1\r\n", "null": b"_\r\n", "oom": b"-OOM full\r\n", "int": b":7\r\n"}


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(sorted(SET_REPLIES)), max_size=60),
    sizes=st.lists(st.integers(1, 12), max_size=80),
)
def test_replies_read_runs_of_ok_in_any_fragmentation(kinds: list[str], sizes: list[int]) -> None:
    """A put's SET replies: the runs of +OK read at once, anything else one by one, in order,
    and the reply after them still in step (the bytes after what was read are never taken)."""
    data = b"".join(SET_REPLIES[k] for k in kinds) + b"+OKAY\r\n:5\r\n"
    reader = ReplyReader(Chunked(data, sizes))  # type: ignore[arg-type]
    got = reader.replies(len(kinds), ERRORS)
    expected = {"ok": b"OK", "nil": None, "null": None, "int": 7}
    assert len(got) == len(kinds)
    for kind, reply in zip(kinds, got, strict=True):
        if kind == "oom":
            assert isinstance(reply, redis.exceptions.ResponseError)
        else:
            assert reply == expected[kind]
    assert reader.replies(2, ERRORS) == [b"OKAY", 5]


def test_error_replies() -> None:
    reader = ReplyReader(Chunked(b"-NOSCRIPT No matching script\r\n-ERR bad\r\n!5\r\nERR x\r\n", [3]))  # type: ignore[arg-type]
    first = reader.reply(ERRORS)
    assert isinstance(first, redis.exceptions.NoScriptError) and "No matching" in str(first)
    assert type(reader.reply(ERRORS)) is redis.exceptions.ResponseError
    assert type(reader.reply(ERRORS)) is redis.exceptions.ResponseError  # RESP3's bulk error
    with pytest.raises(redis.exceptions.ResponseError):
        ReplyReader(Chunked(b"-LOADING wait\r\n", [])).bulks_into([], ERRORS)  # type: ignore[arg-type]


def test_resp3_types_and_a_long_line() -> None:
    long = b"+" + b"y" * 40_000 + b"\r\n"  # longer than the scratch buffer
    data = b"%1\r\n+a\r\n#t\r\n|1\r\n+ttl\r\n:3\r\n,1.5\r\n(12345678901234567890\r\n=7\r\ntxt:abc\r\n" + long
    reader = ReplyReader(Chunked(data, [5, 1, 1, 2]))  # type: ignore[arg-type]
    assert reader.reply(ERRORS) == [b"a", True]
    assert reader.reply(ERRORS) == 1.5  # the attribute went with it
    assert reader.reply(ERRORS) == 12345678901234567890
    assert reader.reply(ERRORS) == b"txt:abc"
    assert reader.reply(ERRORS) == b"y" * 40_000


@pytest.mark.parametrize(
    "data",
    [b"*2\r\n$3\r\nabc\r\n", b"*1\r\n$3\r\nabcXY", b"?what\r\n", b"*x\r\n", b"*1\r\n:1\r\n"],
    ids=["cut short", "no CRLF", "unknown type", "bad count", "not a bulk"],
)
def test_a_broken_stream_raises_a_connection_error(data: bytes) -> None:
    reader = ReplyReader(Chunked(data, []))  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):  # ProtocolError is one: the store counts a fault
        reader.bulks_into([memoryview(bytearray(3)) for _ in range(2 if data.startswith(b"*2") else 1)], ERRORS)
    assert issubclass(ProtocolError, ConnectionError)


class OtherConnection(redis.Connection):
    """A connection class the store does not know: it reads through the client's own parser."""


def _client(url: str, kind: str) -> redis.Redis:
    if kind == "other":
        pool = redis.ConnectionPool.from_url(url, connection_class=OtherConnection)
        return redis.Redis(connection_pool=pool)
    return redis.Redis.from_url(url, protocol=2 if kind == "resp2" else 3)


@pytest.mark.parametrize("kind", ["resp2", "resp3", "other"])
def test_store_reads_with_each_client(kind: str, valkey: ValkeyServer, client: redis.Redis) -> None:
    keys, values = make_chain(12, 70_000)  # values longer than a socket read
    own = _client(valkey.url, kind)
    with RedisBlockStore(valkey.url, client=own, batch=4) as store:
        store.put(keys, values)
        assert store.flush()
        buffers = buffers_for(values)
        assert store.get_into(keys, buffers) == 12 and [bytes(b) for b in buffers] == values
        assert store._reads_itself is (kind != "other")
        client.set(keys[5], values[5][:-1])  # a bad value mid-batch: the rest of its reply is read
        client.delete(keys[9])
        assert store.get_into(keys, buffers) == 5
        assert store.get_into(keys[6:], buffers[6:]) == 3  # the connection is still in step
        assert [bytes(b) for b in buffers[6:9]] == values[6:9]
        assert store.contains(keys) == 12 - 3 and own.ping()
        stats = store.stats()
    assert stats.errors == 0 and stats.bad_values == 1 and stats.hits == 12 + 5 + 3
    own.close()
