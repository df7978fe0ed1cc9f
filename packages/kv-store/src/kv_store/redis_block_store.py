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
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kv_api.block_store import BlockStore
from kv_api.block_value import read_header
from kv_store.chain_lru import CHAIN_SCRIPT, CHAINED_KEY_SIZE, Chain, hangs_under
from kv_store.circuit_breaker import CircuitBreaker
from kv_store.store_stats import StoreStats
from kv_store.store_url import safe_url, url_secrets

if TYPE_CHECKING:
    import redis

__all__ = ["RedisBlockStore"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Job:
    """A put batch (``chain``: its blocks' places, read on the writer thread)."""

    keys: list[bytes]
    values: list[bytes]
    nbytes: int
    chain: Chain | None = None


@dataclasses.dataclass
class _Counters:
    values: dict[str, float] = dataclasses.field(
        default_factory=lambda: {f.name: 0 for f in dataclasses.fields(StoreStats)}
    )
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def add(self, **deltas: float) -> None:
        with self.lock:
            for name, delta in deltas.items():
                self.values[name] += delta

    def snapshot(self) -> StoreStats:
        with self.lock:
            values: dict[str, Any] = {k: (v if k == "call_seconds" else int(v)) for k, v in self.values.items()}
        return StoreStats(**values)


def _byte_view(buffer: memoryview) -> memoryview:
    return buffer if buffer.format == "B" and buffer.ndim == 1 else buffer.cast("B")


class RedisBlockStore(BlockStore):
    """Blocks on the server at ``url`` (``redis://[user:password@]host:port/db``, ``rediss://``
    for TLS, ``unix://``), or on ``client`` (a ``redis.Redis``; ``url`` then only names it).

    ``ttl``: seconds a block lives (None: until evicted). ``timeout``: seconds per connect and per
    socket operation. ``max_pending_bytes``: the most value bytes queued for the writer (a put
    that does not fit keeps its first blocks and drops the rest). ``batch`` / ``batch_bytes``: the
    most keys / value bytes per command or pipeline. ``close_timeout``: how long ``close`` waits for
    the queue. ``backoff_s`` / ``max_backoff_s``: the breaker's first and longest open period.
    ``order_chains``: the chain-aware LRU of the module's doc, at ``index_key``, its walks at most
    ``max_walk`` blocks long; off, puts go head first and the server's eviction alone decides.
    Threads may share it."""

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
        # ConnectionError covers refused, reset, timeouts and auth failures; ResponseError an OOM
        # reply; OSError what a socket raises outside redis-py's wrapping
        self._faults: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._no_script: type[BaseException] = redis.exceptions.NoScriptError
        self._refused: type[BaseException] = redis.exceptions.ResponseError
        self._full: type[BaseException] = redis.exceptions.OutOfMemoryError
        self._owns_client = client is None
        self._client: redis.Redis = client if client is not None else self._connect(url)
        self._breaker = CircuitBreaker(base_s=backoff_s, cap_s=max_backoff_s)
        self._counters = _Counters()
        self._script_sha: str | None = None
        self._chains_on = order_chains  # off for good when the server refuses the script
        self._refusals = 0  # script refusals in a row
        self._queue: deque[_Job] = deque()
        self._pending = 0  # bytes in the queue and in the job being written
        self._busy = False
        self._closed = False
        self._stop = False
        self._cond = threading.Condition()
        self._writer = threading.Thread(target=self._write_loop, name="kv-store-redis-writer", daemon=True)
        self._writer.start()

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
                    got += self._copy(self._read(keys[got:stop]), buffers[got:stop])
                    if got < stop:
                        break
            except self._faults as exc:
                self._fault(exc, "get_into")
            else:
                self._breaker.record_success()
            return got

    def _read(self, keys: Sequence[bytes]) -> list[object]:
        """MGET ``keys``; with the chain LRU on, the touch of the blocks it finds in the same round
        trip (the script reads their places from what is stored)."""
        sha = self._sha() if self._chains_on else None
        if sha is None:
            return list(self._client.mget(keys))
        pipe = self._client.pipeline(transaction=False)
        pipe.mget(keys)
        args: list[Any] = [self.index_key, 0, b"", b"", self.max_walk, self.touch_window_s, self._ttl_ms or 0, 1, 0]
        pipe.evalsha(sha, 0, *args, *keys)
        values, touched = pipe.execute(raise_on_error=False)
        if isinstance(values, BaseException):
            raise values
        with contextlib.suppress(*self._faults):  # a touch refused costs no block now
            self._script_answer(touched)
        return list(values)

    def _copy(self, values: Sequence[object], buffers: Sequence[memoryview]) -> int:
        """Copy values into buffers up to the first missing or bad one; returns how many."""
        copied = nbytes = bad = 0
        for value, buffer in zip(values, buffers, strict=True):
            if value is None:
                break
            view = _byte_view(buffer)
            if not isinstance(value, bytes) or len(value) != view.nbytes:  # str: a decode_responses client
                bad = 1
                break
            view[:] = value
            copied += 1
            nbytes += len(value)
        self._counters.add(hits=copied, bytes_read=nbytes, bad_values=bad)
        return copied

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        with self._timed():
            self._counters.add(puts=len(keys))
            if not keys:
                return
            if self._closed or self._breaker.retry_in() > 0:
                self._counters.add(dropped=len(keys))  # down: dropping costs nothing, queueing would
                return
            owned = [v if type(v) is bytes else bytes(v) for v in values]
            with self._cond:
                room = self.max_pending_bytes - self._pending
                fits = 0
                for value in owned:  # keep a prefix: a chain's tail is useless without its head
                    if len(value) > room:
                        break
                    room -= len(value)
                    fits += 1
                if fits:
                    nbytes = sum(len(v) for v in owned[:fits])
                    self._queue.append(_Job([bytes(k) for k in keys[:fits]], owned[:fits], nbytes))
                    self._pending += nbytes
                    self._cond.notify_all()
            if fits < len(keys):
                self._counters.add(dropped=len(keys) - fits)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s (None: ``close_timeout``) for the queued puts;
        True when none is left. Not a BlockStore call: for tests and tools."""
        with self._cond:
            return self._drain(self.close_timeout if timeout is None else timeout)

    def _drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (self._queue or self._busy) and time.monotonic() < deadline:
            self._cond.wait(max(0.0, deadline - time.monotonic()))
        return not (self._queue or self._busy)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True  # puts from now on are dropped
            self._drain(self.close_timeout)
            left = sum(len(job.values) for job in self._queue)
            self._queue.clear()
            self._stop = True
            self._cond.notify_all()
        self._counters.add(dropped=left)
        # the job in flight ends within a few socket timeouts; the thread is a daemon anyway
        self._writer.join(timeout=4 * self.timeout + 1.0)
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
            self._counters.add(calls=1, call_seconds=time.perf_counter() - start)

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

    # -- the writer thread --------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                job = self._take()
                self._busy = True
            try:
                self._run(job)
            except Exception as exc:  # noqa: BLE001 (a bug here must not end the writer)
                self._counters.add(errors=1, dropped=len(job.values))
                log.error("%s: writer failed: %s", self.url, self._scrub(f"{type(exc).__name__}: {exc}"))
            finally:
                with self._cond:
                    self._pending -= job.nbytes
                    self._busy = False
                    self._cond.notify_all()

    def _take(self) -> _Job:
        """The next put, with the queued puts that continue its chain (a decode's one block per
        put) joined to it, up to ``batch_bytes``: one round trip for all of them. Called with the
        queue's lock held: one header read per join."""
        job = self._queue.popleft()
        while self._chains_on and self._queue:
            after = self._queue[0]
            if job.nbytes + after.nbytes > self.batch_bytes or not self._continues(job, after):
                break
            self._queue.popleft()
            job = _Job(job.keys + after.keys, job.values + after.values, job.nbytes + after.nbytes)
        return job

    @staticmethod
    def _continues(job: _Job, after: _Job) -> bool:
        header = read_header(after.values[0])
        return header is not None and hangs_under(job.keys[-1], after.keys[0], header.parent)

    def _run(self, job: _Job) -> None:
        if not self._breaker.allow():
            self._counters.add(dropped=len(job.values))
            return
        try:
            if self._chains_on and job.chain is None:
                job.chain = Chain.of(job.keys, job.values)  # here, not in put: off the caller's thread
            if self._chains_on and job.chain is not None:
                self._write_chained(job)
            else:
                self._write(job)
        except self._faults as exc:
            self._fault(exc, "put")
            return
        self._breaker.record_success()

    def _write_chained(self, job: _Job) -> None:
        """For each chunk of ``job``, head first (a chunk's parent is the one before it), one
        pipeline: the chain script (room made, blocks scored), then the values' SET NXs. Raises
        the first fault, its blocks and the ones after it counted as dropped."""
        assert job.chain is not None
        chunks = self._chunks(job)
        parent = job.chain.parent
        for n, chunk in enumerate(chunks):
            later = sum(len(c) for c in chunks[n + 1 :])
            try:
                script, replies = self._chain_call(job, chunk, parent)
            except self._faults:
                self._counters.add(dropped=len(chunk) + later)
                raise
            failure = self._count_sets(job, chunk, replies)
            try:
                answer = self._script_answer(script)
            except self._faults:
                self._counters.add(dropped=later)
                raise
            whole, deleted, full = answer if answer is not None else (1, 0, 0)
            self._counters.add(evicted=deleted)
            if not whole:  # its parent is gone: no reader could reach what was just written
                self._counters.add(dropped=later)
                self._unwrite(job, chunk, replies)
                return
            if full or failure is not None:
                # a noeviction server full of what the store may not evict is a fault: the
                # breaker backs the writes off
                self._counters.add(dropped=later)
                raise failure or self._full("the server is at maxmemory (noeviction) with no block of ours to evict")
            parent = job.keys[chunk.stop - 1][-CHAINED_KEY_SIZE:]

    def _chain_call(self, job: _Job, chunk: range, parent: bytes) -> tuple[object, list[object]]:
        """One pipeline for ``chunk`` of ``job``: the chain script scoring its blocks (none where
        the server refuses scripts), then each block's SET NX. The script's reply and the SETs'."""
        assert job.chain is not None
        sha = self._sha()
        pipe = self._client.pipeline(transaction=False)
        if sha is not None:
            nbytes = sum(len(job.values[i]) for i in chunk)
            # Room for the values and as much again: the next request carrying values is in the
            # server's memory before a script runs, and over maxmemory the server evicts first.
            need = 2 * nbytes + (64 << 10)
            args: list[Any] = [self.index_key, need, job.chain.namespace, parent, self.max_walk, self.touch_window_s]
            args += [self._ttl_ms or 0, 2, nbytes]
            for i in chunk:
                args += [job.keys[i], job.chain.tokens[i]]
            pipe.evalsha(sha, 0, *args)
        for i in chunk:
            pipe.set(job.keys[i], job.values[i], nx=True, px=self._ttl_ms)
        replies = pipe.execute(raise_on_error=False)
        return (replies[0], replies[1:]) if sha is not None else (None, replies)

    def _unwrite(self, job: _Job, chunk: range, replies: list[object]) -> None:
        """Delete the blocks of ``chunk`` its SET NXs wrote (``replies``): they are dropped."""
        mine = [i for i, reply in zip(chunk, replies, strict=True) if reply is True]
        if mine:
            self._client.delete(*(job.keys[i] for i in mine))
            nbytes = sum(len(job.values[i]) for i in mine)
            self._counters.add(written=-len(mine), bytes_written=-nbytes, dropped=len(mine))

    def _sha(self) -> str | None:
        """The chain script's SHA, loaded once per server (a restarted one has no scripts); None
        where the server refuses scripts."""
        if self._script_sha is None:
            try:
                self._script_sha = str(self._client.script_load(CHAIN_SCRIPT))
            except self._refused as exc:
                if isinstance(exc, self._full):
                    raise
                self._script_refused(exc)
                return None
        return self._script_sha

    def _script_answer(self, reply: object) -> list[int] | None:
        """The chain script's answer among a pipeline's replies; None where it did not run: the
        server lost it (loaded again next time) or refuses it (counted). An OOM reply raises."""
        if reply is None:
            return None
        if isinstance(reply, self._no_script):
            self._script_sha = None
            return None
        if isinstance(reply, self._refused) and not isinstance(reply, self._full) and "OOM" not in str(reply):
            self._script_refused(reply)
            return None
        if isinstance(reply, BaseException):
            raise reply
        self._refusals = 0
        assert isinstance(reply, list)
        return [int(x) for x in reply]

    def _script_refused(self, exc: BaseException) -> None:
        # not a fault of the server (an ACL without scripts, scripting off): after a few in a row
        # the store goes on without its LRU, on the server's eviction alone
        self._refusals += 1
        if self._refusals >= 3:
            self._chains_on = False
            log.warning("%s: chain LRU off (%s)", self.url, self._scrub(f"{type(exc).__name__}: {exc}"))

    def _chunks(self, job: _Job) -> list[range]:
        """``job``'s blocks in runs of at most ``batch`` keys and about ``batch_bytes``."""
        chunks: list[range] = []
        start = 0
        while start < len(job.keys):
            stop, size = start, 0
            while stop < len(job.keys) and stop - start < self.batch and (stop == start or size < self.batch_bytes):
                size += len(job.values[stop])
                stop += 1
            chunks.append(range(start, stop))
            start = stop
        return chunks

    def _write(self, job: _Job) -> None:
        """SET NX each block, in pipelines of ``_chunks``, the chain's tail first when
        ``order_chains`` (the server evicting as it goes then cuts from the tail). Raises the
        first fault, its blocks and the ones after it counted as dropped."""
        chunks = self._chunks(job)
        if self.order_chains:
            chunks = [chunk[::-1] for chunk in reversed(chunks)]
        settled = 0
        try:
            for chunk in chunks:
                failure = self._write_chunk(job, chunk)
                settled += len(chunk)
                if failure is not None:
                    raise failure
        except self._faults:
            self._counters.add(dropped=len(job.keys) - settled)
            raise

    def _write_chunk(self, job: _Job, chunk: range) -> BaseException | None:
        """One pipeline; returns the first refusal among its replies (its blocks counted)."""
        pipe = self._client.pipeline(transaction=False)
        for i in chunk:
            pipe.set(job.keys[i], job.values[i], nx=True, px=self._ttl_ms)
        return self._count_sets(job, chunk, pipe.execute(raise_on_error=False))

    def _count_sets(self, job: _Job, chunk: range, replies: list[object]) -> BaseException | None:
        """Counts what the SET NXs of ``chunk`` did; returns the first refusal among them."""
        written = skipped = failed = nbytes = 0
        failure: BaseException | None = None
        for i, reply in zip(chunk, replies, strict=True):
            if isinstance(reply, BaseException):
                # an OOM reply (noeviction at maxmemory), a READONLY replica, an ACL refusal
                failure = failure or reply
                failed += 1
            elif reply:
                written += 1
                nbytes += len(job.values[i])
            else:
                skipped += 1  # SET NX: another writer (or an earlier put) has it already
        self._counters.add(written=written, skipped=skipped, dropped=failed, bytes_written=nbytes)
        return failure
