"""``RedisBlockStore``'s writer (docs/store.md): puts queue here, bounded in bytes, and one
background thread writes them, joining the puts that continue a chain; with the chain LRU on,
each chunk is one pipeline (one write, then the replies) of the chain script and the values'
``SET NX``es."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from kv_store.chain_lru import CHAINED_KEY_SIZE, Chain
from kv_store.command_packer import Command, Sets

if TYPE_CHECKING:
    from kv_store.redis_block_store import RedisBlockStore

__all__ = ["Job", "RedisWriter"]

log = logging.getLogger("kv_store.redis_block_store")


@dataclasses.dataclass
class Job:
    """A put batch (``chain``: its blocks' places, read on the writer thread)."""

    keys: list[bytes]
    values: list[bytes]
    nbytes: int
    chain: Chain | None = None


class RedisWriter:
    """The writing half of ``store``: its options, client, counters, breaker and chain script."""

    def __init__(self, store: RedisBlockStore) -> None:
        self._store = store
        self._client = store._client
        self._counters = store._counters
        self._breaker = store._breaker
        self._script = store._script
        self._faults = store._faults
        self._full = store._full
        self.batch, self.batch_bytes, self.order_chains = store.batch, store.batch_bytes, store.order_chains
        self.max_pending_bytes, self.linger_s = store.max_pending_bytes, store.linger_s
        self._window = repr(float(store.touch_window_s)).encode()  # packed once: a script argument
        self._queue: deque[Job] = deque()
        self._pending = 0  # bytes in the queue and in the job being written
        self._queued_at = 0.0  # when the oldest queued put came
        self._busy = False
        self._draining = 0  # callers waiting for the queue: no lingering
        self._waiting = False  # the writer waits for a put (or lingers): notify it
        self._stop = False
        self._lock = threading.Lock()  # a put takes it directly: Condition's own with is Python code
        self._cond = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._write_loop, name="kv-store-redis-writer", daemon=True)
        self._thread.start()

    def enqueue(self, keys: Sequence[bytes], owned: list[bytes]) -> int:
        """Queue the first of ``keys`` / ``owned`` (a list the caller gives up) that fit under
        ``max_pending_bytes`` (a chain's tail is useless without its head); how many. Cheap: a
        decode puts a block every few tokens, on the engine's thread."""
        nbytes = sum(map(len, owned))
        with self._lock:
            if self._stop:  # closed: nothing would write it
                return 0
            room = self.max_pending_bytes - self._pending
            fits = len(owned)
            if nbytes > room:
                fits, nbytes = 0, 0
                while fits < len(owned) and nbytes + len(owned[fits]) <= room:
                    nbytes += len(owned[fits])
                    fits += 1
                if not fits:
                    return 0
                keys, owned = keys[:fits], owned[:fits]
            if not self._queue:
                self._queued_at = time.monotonic()
            self._queue.append(Job(list(map(bytes, keys)), owned, nbytes))  # owned: the caller's own list
            self._pending += nbytes
            if self._waiting and (len(self._queue) == 1 or self._pending >= self.batch_bytes):
                self._cond.notify_all()  # the writer waits for a first put, or lingers
        return fits

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the queue; True when nothing is left to write."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._draining += 1
            self._cond.notify_all()
            try:
                while (self._queue or self._busy) and time.monotonic() < deadline:
                    self._cond.wait(max(0.0, deadline - time.monotonic()))
            finally:
                self._draining -= 1
            return not (self._queue or self._busy)

    def stop(self, timeout: float, join_s: float) -> int:
        """Wait up to ``timeout`` s for the queue, drop the rest, end the thread (waiting up to
        ``join_s`` for the job in flight: it is a daemon anyway); how many blocks were dropped."""
        self.drain(timeout)
        with self._cond:
            left = sum(len(job.values) for job in self._queue)
            self._queue.clear()
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=join_s)
        return left

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._waiting = True
                while not self._queue and not self._stop:
                    self._cond.wait()
                self._linger()
                self._waiting = False
                if self._stop:
                    return
                jobs = self._take()
                self._busy = True
            try:
                self._run(jobs)
            except Exception as exc:  # noqa: BLE001 (a bug here must not end the writer)
                self._counters.add(errors=1, dropped=sum(len(job.values) for job in jobs))
                log.error("%s: writer failed: %s", self._store.url, self._store._scrub(f"{type(exc).__name__}: {exc}"))
            finally:
                with self._cond:
                    self._pending -= sum(job.nbytes for job in jobs)
                    self._busy = False
                    self._cond.notify_all()

    def _linger(self) -> None:
        """Wait, up to ``linger_s`` after the oldest queued put, for a batch's worth of puts: an
        engine step's blocks (a decode's one block per put, many caches) then go in one round trip,
        and the engine's thread is not interrupted once per block. Called with the lock held."""
        while not self._stop and not self._draining and self._pending < self.batch_bytes:
            left = self._queued_at + self.linger_s - time.monotonic()
            if left <= 0 or len(self._queue) >= self.batch:
                return
            self._cond.wait(left)

    def _take(self) -> list[Job]:
        """The next puts for one round trip, up to ``batch`` keys and ``batch_bytes``: each with
        the queued puts that continue its chain joined to it (a decode's one block per put).
        Called with the lock held."""
        jobs = [self._take_chain()]
        keys, nbytes = len(jobs[0].keys), jobs[0].nbytes
        while self._queue and keys + len(self._queue[0].keys) <= self.batch:
            if nbytes + self._queue[0].nbytes > self.batch_bytes:
                break
            jobs.append(self._take_chain())
            keys, nbytes = keys + len(jobs[-1].keys), nbytes + jobs[-1].nbytes
        return jobs

    def _take_chain(self) -> Job:
        """The next put's first chain (``Chain.runs``: a put may hold many) with the queued puts
        that continue it, up to ``batch_bytes``."""
        job = self._queue.popleft()
        if not self._script.on:
            return job
        if job.chain is None:  # here, not in put: off the caller's thread
            runs = Chain.runs(job.keys, job.values)
            if len(runs) > 1:  # each chain its own job, in order
                at, jobs = 0, []
                for chain, n in runs:
                    values = job.values[at : at + n]
                    jobs.append(Job(job.keys[at : at + n], values, sum(map(len, values)), chain))
                    at += n
                self._queue.extendleft(reversed(jobs[1:]))
                job = jobs[0]
            job.chain = runs[0][0]
        while job.chain is not None and self._queue:
            after = self._queue[0]
            if job.nbytes + after.nbytes > self.batch_bytes:
                break
            # a piece of a put cut into its chains (chain set) does not continue the one before it
            if after.chain is not None or not job.chain.extend(job.keys[-1], after.keys, after.values):
                break
            self._queue.popleft()
            job.keys += after.keys  # the job's own lists (enqueue's)
            job.values += after.values
            job.nbytes += after.nbytes
        return job

    def _run(self, jobs: list[Job]) -> None:
        if not self._breaker.allow():
            self._counters.add(dropped=sum(len(job.values) for job in jobs))
            return
        try:
            chained = [job for job in jobs if self._script.on and job.chain is not None]
            plain = [job for job in jobs if not (self._script.on and job.chain is not None)]
            if plain:
                self._write(Job([k for j in plain for k in j.keys], [v for j in plain for v in j.values], 0))
            if len(chained) == 1:
                self._write_chained(chained[0])
            elif chained:
                self._write_together(chained)
        except self._faults as exc:
            self._store._fault(exc, "put")
            return
        self._breaker.record_success()

    def _write_together(self, jobs: list[Job]) -> None:
        """Chains of one chunk each (``_take``'s bounds) in one pipeline. Raises the first fault,
        after every chain's replies are counted."""
        self._pipeline([(job, range(len(job.keys)), cast(Chain, job.chain).parent) for job in jobs])

    def _write_chained(self, job: Job) -> None:
        """For each chunk of ``job``, head first (a chunk's parent is the one before it), one
        pipeline. Raises the first fault, its blocks and the ones after it counted as dropped."""
        chunks = self._chunks(job)
        parent = cast(Chain, job.chain).parent
        for n, chunk in enumerate(chunks):
            later = sum(len(c) for c in chunks[n + 1 :])
            try:
                whole = self._pipeline([(job, chunk, parent)])[0]
            except self._faults:
                self._counters.add(dropped=later)
                raise
            if not whole:  # the chain broke: what comes after it is unreachable too
                self._counters.add(dropped=later)
                return
            parent = job.keys[chunk.stop - 1][-CHAINED_KEY_SIZE:]

    def _pipeline(self, groups: list[tuple[Job, range, bytes]]) -> list[bool]:
        """One pipeline for ``groups`` (a chunk of a job, and its first block's parent): the chain
        script making room for them all and scoring each as its chain (none where the server
        refuses scripts), then their SET NXs. Per group, whether its chain is whole (False: its
        parent is gone, and what it wrote is deleted again: no reader could reach it). Raises a
        fault (its blocks dropped), a refusal, or a server full of what the store may not evict
        (the breaker then backs the writes off), after counting every group's SETs."""
        try:
            sha = self._script.sha()
            commands: list[Command] = [] if sha is None else [self._script_call(sha, groups)]
            sets = self._sets([(job, chunk) for job, chunk, _ in groups])
            _, replies = self._store._exchange([*commands, sets])
        except self._faults:
            self._counters.add(dropped=sum(len(chunk) for _, chunk, _ in groups))
            raise
        at = int(sha is not None)
        failure = self._count_sets(sets, replies[at:])
        answer = self._script.answer(replies[0] if sha is not None else None)
        deleted, full, wholes = (answer[0], answer[1], answer[2:]) if answer else (0, 0, [1] * len(groups))
        self._counters.add(evicted=deleted)
        for (job, chunk, _), whole in zip(groups, wholes, strict=True):
            if not whole:
                self._unwrite(job, chunk, replies[at : at + len(chunk)])
            at += len(chunk)
        if full or failure is not None:
            raise failure or self._full("the server is at maxmemory (noeviction) with no block of ours to evict")
        return [bool(whole) for whole in wholes]

    def _script_call(self, sha: str, groups: list[tuple[Job, range, bytes]]) -> list[object]:
        """The chain script's call for ``groups``: room made for their values and as much again
        (the next request carrying values is in the server's memory before a script runs, and
        over maxmemory the server evicts first), each chunk scored as its chain."""
        room = sum(len(job.values[i]) for job, chunk, _ in groups for i in chunk)
        store = self._store
        args: list[object] = [b"EVALSHA", sha.encode(), 0, store.index_key, 2 * room + (64 << 10)]
        args += [store.max_walk, self._window, store._ttl_ms or 0, 2, room]
        for job, chunk, parent in groups:
            tokens = cast(Chain, job.chain).tokens
            args += [cast(Chain, job.chain).namespace, parent, len(chunk)]
            for i in chunk:
                args += [job.keys[i], tokens[i]]
        return args

    def _unwrite(self, job: Job, chunk: range, replies: list[object]) -> None:
        """Delete the blocks of ``chunk`` its SET NXs wrote (``replies``): they are dropped."""
        mine = [i for i, reply in zip(chunk, replies, strict=True) if _wrote(reply)]
        if mine:
            self._client.delete(*(job.keys[i] for i in mine))
            nbytes = sum(len(job.values[i]) for i in mine)
            self._counters.add(written=-len(mine), bytes_written=-nbytes, dropped=len(mine))

    def _chunks(self, job: Job) -> list[range]:
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

    def _write(self, job: Job) -> None:
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

    def _write_chunk(self, job: Job, chunk: range) -> BaseException | None:
        """One pipeline; returns the first refusal among its replies (its blocks counted)."""
        sets = self._sets([(job, chunk)])
        _, replies = self._store._exchange([sets])
        return self._count_sets(sets, replies)

    def _sets(self, chunks: list[tuple[Job, range]]) -> Sets:
        """Each block's ``SET key value NX [PX ttl]`` of ``chunks`` (jobs' chunks), in order: the
        value goes as it is (``command_packer``)."""
        ttl = self._store._ttl_ms
        tail = (b"NX",) if ttl is None else (b"NX", b"PX", b"%d" % ttl)
        if len(chunks) == 1 and chunks[0][1] == range(len(chunks[0][0].keys)):
            return Sets(chunks[0][0].keys, chunks[0][0].values, tail)  # a whole job: its own lists
        keys = [job.keys[i] for job, chunk in chunks for i in chunk]
        return Sets(keys, [job.values[i] for job, chunk in chunks for i in chunk], tail)

    def _count_sets(self, sets: Sets, replies: list[object]) -> BaseException | None:
        """Counts what the SET NXs of ``sets`` did (``replies``); returns the first refusal."""
        if replies.count(b"OK") == len(replies):  # all written: a put's common case
            self._counters.add(written=len(replies), bytes_written=sum(map(len, sets.values)))
            return None
        written = skipped = failed = nbytes = 0
        failure: BaseException | None = None
        for value, reply in zip(sets.values, replies, strict=True):
            if isinstance(reply, BaseException):
                # an OOM reply (noeviction at maxmemory), a READONLY replica, an ACL refusal
                failure = failure or reply
                failed += 1
            elif _wrote(reply):
                written += 1
                nbytes += len(value)
            else:
                skipped += 1  # SET NX: another writer (or an earlier put) has it already
        self._counters.add(written=written, skipped=skipped, dropped=failed, bytes_written=nbytes)
        return failure


def _wrote(reply: object) -> bool:
    """Whether a SET NX's reply says it wrote (OK; None: the key was there; else a refusal)."""
    return reply is not None and not isinstance(reply, BaseException)
