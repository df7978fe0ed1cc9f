"""A block store on a Valkey/Redis server a fleet shares (docs/store.md): one string per block,
under the block's store key, written once (``SET NX``).

Reads run on the caller's thread (the manager's lock is held: bounded by ``timeout`` per socket
operation); writes go to one background thread through a queue bounded in bytes. Every server
fault is counted and opens a circuit breaker; while it is open no call touches the network.

The chain-aware LRU on the server that keeps chains reachable as it evicts: ``chain_lru``."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kv_api.block_store import BlockStore
from kv_store.chain_lru import ChainScript
from kv_store.circuit_breaker import CircuitBreaker
from kv_store.command_packer import Command, command_count, pack, send, unpacked
from kv_store.redis_writer import RedisWriter
from kv_store.reply_reader import BulkResult, ReplyReader
from kv_store.store_stats import Counters, StoreStats
from kv_store.store_url import safe_url, url_secrets

if TYPE_CHECKING:
    import redis

__all__ = ["RedisBlockStore"]

log = logging.getLogger(__name__)


def _byte_view(buffer: memoryview) -> memoryview:
    return buffer if buffer.format == "B" and buffer.ndim == 1 else buffer.cast("B")


def _copy_values(values: object, buffers: Sequence[memoryview]) -> BulkResult:
    """What ``ReplyReader.bulks_into`` does, for values the client's parser read (``bytes``)."""
    result = BulkResult()
    assert isinstance(values, list)
    for value, buffer in zip(values, buffers, strict=True):
        if not result.accept(-1 if value is None else len(value), buffer.nbytes):
            break
        buffer[:] = value
    return result


class RedisBlockStore(BlockStore):
    """Blocks on the server at ``url`` (``redis://[user:password@]host:port/db``, ``rediss://``
    for TLS, ``unix://``), or on ``client`` (a ``redis.Redis``; ``url`` then only names it).

    ``ttl``: seconds a block lives (None: until evicted). ``timeout``: seconds per connect and per
    socket operation. ``max_pending_bytes``: the most value bytes queued for the writer (a put
    that does not fit keeps its first blocks and drops the rest). ``batch`` / ``batch_bytes``: the
    most keys / value bytes per command or pipeline. ``close_timeout``: how long ``close`` waits for
    the queue. ``backoff_s`` / ``max_backoff_s``: the breaker's first and longest open period.
    ``order_chains``: the chain-aware LRU of the module's doc, at ``index_key``, its walks at most
    ``max_walk`` blocks long, a block scored less than ``touch_window_s`` ago not scored again;
    off, puts go head first and the server's eviction alone decides. ``linger_s``: how long the
    writer waits after a put for more (up to a batch) to send them in one round trip. ``client``:
    reads and writes use its connections' sockets directly where they are redis-py's own
    (``command_packer``, ``reply_reader``), else its parser. Threads may share it."""

    def __init__(
        self,
        url: str,
        *,
        ttl: float | None = None,
        timeout: float = 0.5,
        max_pending_bytes: int = 64 << 20,
        batch: int = 128,
        batch_bytes: int = 16 << 20,
        close_timeout: float = 5.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        order_chains: bool = True,
        index_key: bytes = b"kvcore:block-lru",
        max_walk: int = 4096,
        touch_window_s: float = 1.0,
        linger_s: float = 0.002,
        client: redis.Redis | None = None,
    ) -> None:
        try:
            import redis
        except ImportError:
            raise ImportError("RedisBlockStore needs the redis client: pip install 'kv-store[redis]'") from None
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be positive")
        if batch < 1 or batch_bytes < 1:
            raise ValueError("batch and batch_bytes must be positive")
        if linger_s < 0:
            raise ValueError("linger_s must not be negative")
        self.url = safe_url(url)  # the only form of the url this object keeps
        self._secrets = url_secrets(url)
        self._ttl_ms = None if ttl is None else max(1, round(ttl * 1000))
        self.timeout = timeout
        self.max_pending_bytes = max_pending_bytes
        self.batch = batch
        self.batch_bytes = batch_bytes
        self.close_timeout = close_timeout
        self.order_chains = order_chains
        self.index_key = index_key
        self.max_walk = max_walk
        self.touch_window_s = touch_window_s
        self.linger_s = linger_s
        # ConnectionError covers refused, reset, timeouts and auth failures; ResponseError an OOM
        # reply; OSError what a socket raises outside redis-py's wrapping
        self._faults: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._refused: type[BaseException] = redis.exceptions.ResponseError
        self._full: type[BaseException] = redis.exceptions.OutOfMemoryError
        # the error replies a read can meet, by their first word, for ReplyReader
        self._errors: dict[str, type[Exception]] = {
            "NOSCRIPT": redis.exceptions.NoScriptError,
            "OOM": redis.exceptions.OutOfMemoryError,
            "": redis.exceptions.ResponseError,
        }
        self._reads_itself: bool | None = None  # whether reads parse replies themselves (_own_socket)
        self._owns_client = client is None
        self._client: redis.Redis = client if client is not None else self._connect(url)
        self._breaker = CircuitBreaker(base_s=backoff_s, cap_s=max_backoff_s)
        self._counters = Counters()
        self._script = ChainScript(
            self._client, order_chains, self.url, lambda exc: self._scrub(f"{type(exc).__name__}: {exc}")
        )
        self._closed = False
        self._lock = threading.Lock()
        self._writer = RedisWriter(self)

    def _connect(self, url: str) -> redis.Redis:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        try:
            # no retries: the breaker decides when to try again, and a retry is a hang
            return redis.Redis.from_url(
                url,
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
            )
        except ValueError as exc:
            raise ValueError(f"bad store url {self.url}: {self._scrub(str(exc))}") from None

    # -- the BlockStore calls ----------------------------------------------------------------------

    def contains(self, keys: Sequence[bytes]) -> int:
        with self._timed():
            self._counters.add(lookups=1)
            if not keys or self._closed or not self._breaker.allow():
                return 0
            try:
                found = self._present_prefix(keys)
            except self._faults as exc:
                self._fault(exc, "contains")
                return 0
            self._breaker.record_success()
            return found

    def _present_prefix(self, keys: Sequence[bytes]) -> int:
        """How many of ``keys`` are stored, from the first: the first key alone (a miss there is
        the common answer), then runs of ``batch`` keys, each one multi-key ``EXISTS`` (a count),
        halved to find the first missing key of a run that is not whole."""
        if not self._client.exists(keys[0]):
            return 0
        found = 1
        while found < len(keys):
            run = keys[found : found + self.batch]
            if self._client.exists(*run) == len(run):
                found += len(run)
                continue
            low, high = 0, len(run)  # run[:low] stored; run[:high] not all stored
            while high - low > 1:
                middle = (low + high) // 2
                if self._client.exists(*run[low:middle]) == middle - low:
                    low = middle
                else:
                    high = middle
            return found + low
        return found

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        if len(keys) != len(buffers):
            raise ValueError(f"{len(keys)} keys but {len(buffers)} buffers")
        with self._timed():
            self._counters.add(gets=1)
            if not keys or self._closed or not self._breaker.allow():
                return 0
            got = 0
            try:
                while got < len(keys):
                    size = max(1, _byte_view(buffers[got]).nbytes)
                    stop = min(len(keys), got + self.batch, got + max(1, self.batch_bytes // size))
                    got += self._read(keys[got:stop], [_byte_view(b) for b in buffers[got:stop]])
                    if got < stop:
                        break
            except self._faults as exc:
                self._fault(exc, "get_into")
            else:
                self._breaker.record_success()
            return got

    def _read(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        """MGET ``keys`` into ``buffers`` (bytes, 1-D) up to the first missing or bad value; with the
        chain LRU on, the touch of the blocks it finds in the same round trip (the script reads
        their places from what is stored). How many were copied."""
        sha = self._script.sha()
        commands: list[tuple[Any, ...]] = [(b"MGET", *keys)]
        if sha is not None:
            args = [self.index_key, 0, self.max_walk, self.touch_window_s, self._ttl_ms or 0, 1, 0]
            commands.append((b"EVALSHA", sha.encode(), 0, *args, *keys))
        result, replies = self._exchange(commands, buffers)
        self._counters.add(hits=result.copied, bytes_read=result.nbytes, bad_values=int(result.bad))
        with contextlib.suppress(*self._faults):  # a touch refused costs no block now
            self._script.answer(replies[0] if replies else None)
        return result.copied

    def _exchange(
        self, commands: Sequence[Command], buffers: Sequence[memoryview] | None = None
    ) -> tuple[BulkResult, list[object]]:
        """Send ``commands`` in one write and read their replies: with ``buffers``, the first
        command's values into them (an MGET: ``ReplyReader.bulks_into``), then the others' replies
        in order (a ``Sets`` one per key), an error reply as an exception instance. Raises a
        fault; the connection is then dropped (out of step with the server: the next call
        connects afresh)."""
        pool = self._client.connection_pool
        connection: Any = pool.get_connection()  # its socket is used below: not a typed API
        count = command_count(commands) - (buffers is not None)
        try:
            sock = self._own_socket(connection)
            if sock is None:
                connection.send_packed_command(connection.pack_commands(unpacked(commands)))
                bulk = BulkResult()
                if buffers is not None:
                    bulk = _copy_values(connection.read_response(disable_decoding=True), buffers)
                replies = [self._client_reply(connection) for _ in range(count)]
            else:
                send(sock, pack(commands))
                reader = ReplyReader(sock)
                bulk = reader.bulks_into(buffers, self._errors) if buffers is not None else BulkResult()
                replies = reader.replies(count, self._errors)
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
        return bulk, replies

    def _own_socket(self, connection: Any) -> socket.socket | None:
        """The connection's socket where this store may read its replies itself (redis-py's own
        TCP, TLS and Unix socket connections); None where the client's parser must (client-side
        caching, or any other connection class: what it does with the socket is not known)."""
        if self._reads_itself is None:
            import redis

            own = (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)
            self._reads_itself = type(connection) in own and str(getattr(connection, "protocol", 2)) in ("2", "3")
        if not self._reads_itself:
            return None
        if connection._sock is None:
            connection.connect()
        sock: socket.socket | None = connection._sock
        return sock

    def _client_reply(self, connection: Any) -> object:
        """The next reply through the client's own parser; an error reply as an instance."""
        try:
            return connection.read_response(disable_decoding=True)
        except self._refused as exc:
            return exc

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> float | None:
        """Queue the values for the writer; while the store drops every put (closed, or the
        breaker open), the seconds until it may take one again (the manager then encodes none)."""
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        start = time.perf_counter()  # not _timed: a decode step puts a block every few tokens
        dropped = 0
        pause = math.inf if self._closed else 0.0 if self._breaker.closed else self._breaker.retry_in()
        if keys and pause > 0:
            dropped = len(keys)  # down: dropping costs nothing, queueing would
        elif keys:
            # bytes(v) of a bytes object is that object: only another buffer is copied
            dropped = len(keys) - self._writer.enqueue(keys, list(map(bytes, values)))
        self._counters.add_put(len(keys), dropped, time.perf_counter() - start)
        return pause or None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s (None: ``close_timeout``) for the queued puts;
        True when none is left. Not a BlockStore call: for tests and tools."""
        return self._writer.drain(self.close_timeout if timeout is None else timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True  # puts from now on are dropped
        # the job in flight ends within a few socket timeouts
        self._counters.add(dropped=self._writer.stop(self.close_timeout, 4 * self.timeout + 1.0))
        if self._owns_client:
            try:
                self._client.close()
            except self._faults:
                pass

    def stats(self) -> StoreStats:
        # the breaker counts its own openings: two calls failing together open it once
        return dataclasses.replace(self._counters.snapshot(), breaker_opens=self._breaker.opens)

    def __repr__(self) -> str:
        return f"RedisBlockStore({self.url!r}, {self._breaker.state.value})"

    __str__ = __repr__

    def __enter__(self) -> RedisBlockStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- faults -------------------------------------------------------------------------------------

    @contextmanager
    def _timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._counters.call(time.perf_counter() - start)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _fault(self, exc: BaseException, what: str) -> None:
        """Count a failed operation and open the breaker; never shows a credential."""
        self._counters.add(errors=1)
        message = self._scrub(f"{type(exc).__name__}: {exc}")
        if self._breaker.record_failure():
            log.warning("%s: %s failed (%s); no calls for %.1f s", self.url, what, message, self._breaker.retry_in())
        else:
            log.debug("%s: %s failed (%s)", self.url, what, message)
