"""A block store in a local directory that survives restarts (docs/store.md).

One file per block, exactly the value's bytes, named after the key's SHA-256, its parent's and its
depth (``file_index``). ``put`` queues; one writer thread writes each value to a temp file in the
directory and renames it into place, so a reader (or a process after ``kill -9``) sees a whole file
or none. No fsync: a rename is atomic against a process crash without one, and what a power loss
can leave (a short file, a file of zeros) is a length mismatch here or a checksum mismatch in the
manager, which checks every value it is given; a cache need not outlive the page cache.

An exclusive ``flock`` on ``<dir>/.lock`` keeps a second store (in any process) off a directory
in use: the in-memory index and the size bound assume one writer."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import math
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType

from kv_api.block_store import BlockStore
from kv_api.block_value import read_place
from kv_store.chain_lru import CHAINED_KEY_SIZE
from kv_store.file_index import TEMP_PREFIX, Entry, FileIndex, file_name, key_id, scan_directory
from kv_store.store_stats import CALL_BUCKETS, StoreStats, call_bucket

__all__ = ["FileBlockStore"]

LOCK_NAME = ".lock"
_COUNTERS = (
    "lookups", "gets", "hits", "bad_values", "puts", "written", "skipped", "dropped", "errors",
    "breaker_opens", "bytes_read", "bytes_written", "calls", "evicted",
)  # fmt: skip


class FileBlockStore(BlockStore):
    """Values as files in ``path`` (created if missing; its parent must exist).

    ``max_bytes`` bounds the value bytes on disk (temp file included), at open too; ``None``: no
    bound. ``max_pending_bytes`` bounds the values queued for the writer; what does not fit is
    dropped. ``close`` waits at most ``close_timeout`` seconds for the queue. Threads may share it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        max_pending_bytes: int = 64 << 20,
        close_timeout: float = 10.0,
    ) -> None:
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_pending_bytes
        self.close_timeout = close_timeout
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.path)
        self._lock_fd = _lock_directory(self.path)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the writer waits for puts
        self._idle = threading.Condition(self._lock)  # flush waits for the writer
        self._index = FileIndex()
        self._queue: deque[Entry] = deque()
        self._writing = False
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._call_ns = 0
        self._call_buckets = [0] * (len(CALL_BUCKETS) + 1)
        self._last_tick = 0
        self._temp_names = itertools.count()
        self._closing = False
        self._closed = False
        self._deadline = 0.0
        self._open_index()
        self._writer = threading.Thread(target=self._run, name=f"FileBlockStore writer {self.path}", daemon=True)
        self._writer.start()

    # -- BlockStore

    def contains(self, keys: Sequence[bytes]) -> int:
        start = time.perf_counter_ns()
        with self._lock:
            self._counts["lookups"] += 1
            n = 0
            if not self._closed:
                entries = self._index.entries
                while n < len(keys) and key_id(keys[n]) in entries:
                    n += 1
            self._count_call(start)
            return n

    def get_into(self, keys: Sequence[bytes], buffers: Sequence[memoryview]) -> int:
        start = time.perf_counter_ns()
        with self._lock:
            self._counts["gets"] += 1
            n = 0
            last: Entry | None = None
            if not self._closed:
                tick = self._next_tick()
                for key, buffer in zip(keys, buffers, strict=True):
                    entry = self._index.entries.get(key_id(key))
                    if entry is None or not self._read_into(entry, buffer):
                        break
                    self._index.touch(entry, tick)
                    last = entry
                    n += 1
            if last is not None and last.value is None:
                # The next open orders by mtime: the deepest block read carries the chain's use over
                # a restart (its ancestors inherit it as its descendants go).
                with contextlib.suppress(OSError):
                    os.utime(os.path.join(self.path, file_name(last)), ns=(last.tick, last.tick))
            self._counts["hits"] += n
            self._count_call(start)
            return n

    def put(self, keys: Sequence[bytes], values: Sequence[bytes]) -> float | None:
        """Queue the values for the writer thread; closed, it drops every put for ever (inf)."""
        start = time.perf_counter_ns()
        with self._lock:
            self._counts["puts"] += len(keys)
            closing = self._closing
            if closing:
                self._counts["dropped"] += len(keys)
            else:
                self._enqueue(keys, values)
            self._count_call(start)
        return math.inf if closing else None

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._deadline = time.monotonic() + self.close_timeout
            self._work.notify_all()
        # The writer drops what it has not started by the deadline; one write in flight may outlast it.
        self._writer.join(self.close_timeout + 1.0)
        with self._lock:
            self._closed = True
            os.close(self._lock_fd)

    # -- beyond the contract

    def flush(self, timeout: float) -> bool:
        """Wait until every queued value is written or dropped; False where ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._writing:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._writer.is_alive():
                    return False
                self._idle.wait(remaining)
            return True

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(**self._counts, call_seconds=self._call_ns / 1e9, call_buckets=tuple(self._call_buckets))

    def __enter__(self) -> FileBlockStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- calls (lock held)

    def _enqueue(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        tick = self._next_tick()
        previous: Entry | None = None
        dropping = False  # once a block is dropped, the chain's later ones would be unreachable
        for key, value in zip(keys, values, strict=True):
            ident = key_id(key)
            entry = self._index.entries.get(ident)
            if entry is not None:
                self._counts["skipped"] += 1  # a fleet writes a block once: the first value stays
                self._index.touch(entry, tick)
                previous = entry
                continue
            size = len(value)
            if (
                dropping
                or self._index.pending_bytes + size > self.max_pending_bytes
                or (self.max_bytes is not None and size > self.max_bytes)
            ):
                dropping = True
                self._counts["dropped"] += 1
                continue
            parent, depth = _lineage(key, value, previous)
            entry = Entry(ident, parent, depth, size, tick, value=value)
            self._index.add(entry)
            self._queue.append(entry)
            previous = entry
        if self._queue:
            self._work.notify()

    def _read_into(self, entry: Entry, buffer: memoryview) -> bool:
        view = buffer if buffer.format == "B" and buffer.ndim == 1 else buffer.cast("B")
        if entry.value is not None:  # still queued: served from memory
            if len(entry.value) != len(view):
                self._counts["bad_values"] += 1
                self._index.remove(entry.id)
                return False
            view[:] = entry.value
        else:
            got = self._read_file(entry, view)
            if got is None:
                return False
            if got != len(view):
                self._counts["bad_values"] += 1
                self._delete(entry)
                return False
        self._counts["bytes_read"] += len(view)
        return True

    def _read_file(self, entry: Entry, view: memoryview) -> int | None:
        """Bytes read into ``view`` (-1: the file's length is not the buffer's); None: an error."""
        try:
            fd = os.open(os.path.join(self.path, file_name(entry)), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            self._counts["errors"] += 1
            if isinstance(error, FileNotFoundError):
                self._index.remove(entry.id)  # deleted behind our back (or the directory was)
            return None
        try:
            if os.fstat(fd).st_size != len(view):
                return -1
            done = 0
            while done < len(view):
                n = os.readv(fd, [view[done:]])
                if n == 0:
                    break  # shorter than fstat said: truncated while we read
                done += n
            return done
        except OSError:
            self._counts["errors"] += 1
            return None
        finally:
            os.close(fd)

    # -- the writer thread

    def _run(self) -> None:
        while True:
            with self._lock:
                entry = self._next_write()
                if entry is None:
                    self._idle.notify_all()
                    return
            ok = self._write_file(entry)
            with self._lock:
                self._finish_write(entry, ok)

    def _next_write(self) -> Entry | None:
        """The next entry to write, room made for it; None: closing and nothing left (lock held)."""
        while True:
            while not self._queue and not self._closing:
                self._idle.notify_all()
                self._work.wait()
            if not self._queue:
                return None
            if self._closing and time.monotonic() > self._deadline:
                while self._queue:
                    if self._index.remove(self._queue.popleft().id) is not None:
                        self._counts["dropped"] += 1
                return None
            entry = self._queue.popleft()
            if self._index.entries.get(entry.id) is not entry:
                continue  # removed while queued (a bad value)
            if self._index.orphaned(entry) or not self._make_room(entry.size, entry.rooted):
                self._index.remove(entry.id)
                self._counts["dropped"] += 1
                continue
            self._writing = True
            return entry

    def _write_file(self, entry: Entry) -> bool:
        """Write ``entry``'s value to a temp file, then rename it to its name (no lock held)."""
        assert entry.value is not None
        temp = os.path.join(self.path, f"{TEMP_PREFIX}{next(self._temp_names)}")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError:
            return False
        try:
            view = memoryview(entry.value).cast("B")
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            # The next open orders blocks by mtime: the put's tick, exact whatever the clock's grain.
            os.utime(fd, ns=(entry.tick, entry.tick))
            os.close(fd)
            fd = -1
            os.rename(temp, os.path.join(self.path, file_name(entry)))
            return True
        except OSError:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return False

    def _finish_write(self, entry: Entry, ok: bool) -> None:
        self._writing = False
        if self._index.entries.get(entry.id) is not entry:  # removed while being written
            if ok:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.path, file_name(entry)))
        elif ok:
            self._index.written(entry)
            self._counts["written"] += 1
            self._counts["bytes_written"] += entry.size
        else:
            self._index.remove(entry.id)
            self._counts["errors"] += 1
            self._counts["dropped"] += 1
        if not self._queue:
            self._idle.notify_all()

    # -- the directory (lock held)

    def _open_index(self) -> None:
        entries, stale = scan_directory(self.path)
        for name in stale:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.path, name))
        self._index.load(entries)
        self._last_tick = max((e.tick for e in entries), default=0)
        self._make_room(0, True)  # a smaller bound than last time, or files copied in

    def _make_room(self, size: int, rooted: bool) -> bool:
        """Evict until ``size`` more bytes fit under ``max_bytes``; False where they cannot. An
        unrooted block (no chain reaches it from the store) may take free room or an unrooted
        block's, never a rooted block's."""
        if self.max_bytes is None:
            return True
        while self._index.disk_bytes + size > self.max_bytes:
            victim = self._index.victim()
            if victim is None or (victim.rooted and not rooted):
                return False
            self._delete(victim)
            self._counts["evicted"] += 1
        return True

    def _delete(self, entry: Entry) -> None:
        try:
            os.unlink(os.path.join(self.path, file_name(entry)))
        except FileNotFoundError:
            pass
        except OSError:
            self._counts["errors"] += 1
        self._index.remove(entry.id)

    def _next_tick(self) -> int:
        # Wall-clock ns, like the mtimes that order blocks found at open; one per call, so a
        # batch's blocks tie and the deepest goes first.
        self._last_tick = max(time.time_ns(), self._last_tick + 1)
        return self._last_tick

    def _count_call(self, start_ns: int) -> None:
        self._counts["calls"] += 1
        took = time.perf_counter_ns() - start_ns
        self._call_ns += took
        self._call_buckets[call_bucket(took / 1e9)] += 1


def _lineage(key: bytes, value: bytes, previous: Entry | None) -> tuple[bytes | None, int]:
    """The id of the block's parent (None: the first of a chain, or unknown) and its depth: from the
    value's header where it names this key, else the batch's previous block (a put is consecutive
    blocks of one chain)."""
    place = read_place(value)
    if place is not None and len(key) > CHAINED_KEY_SIZE and place[0] == key[-CHAINED_KEY_SIZE:]:
        _, parent, prefix_tokens, num_tokens = place
        if prefix_tokens == num_tokens:
            return None, prefix_tokens  # a chain's first block: its parent is the scope's root, no block
        return key_id(key[:-CHAINED_KEY_SIZE] + parent), prefix_tokens
    if previous is None:
        return None, 1
    return previous.id, previous.depth + 1


def _lock_directory(path: str) -> int:
    """An fd holding ``<path>/.lock`` exclusively (released by close, or by the kernel at exit)."""
    name = os.path.join(path, LOCK_NAME)
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        raise
    except OSError:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)  # a read-only directory: serve what is there
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(f"{path} is in use by another FileBlockStore") from None
    return fd
