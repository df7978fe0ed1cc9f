"""The disk pool's positioned I/O (docs/manager.md, "Eviction and tiers"), with faults injected
into the ``os`` calls it makes: short reads and writes are resumed where they stopped, an
``InterruptedError`` is retried, the end of the file is an ``EIO`` error, a full disk (``ENOSPC``,
``EDQUOT``) is a ``DiskOOMError`` and any other failure an ``OSError`` of its errno; every error
names the tier's directory. Blocks are allocated once per slot below the high-water mark, and a
file system without ``posix_fallocate`` is no error."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kv_api.errors import DiskOOMError
from kv_core_py import disk_pool
from kv_core_py.disk_pool import DiskPool

SLOT = 16
REAL_PREADV = os.preadv
REAL_PWRITE = os.pwrite
REAL_FALLOCATE = os.posix_fallocate


@pytest.fixture(autouse=True)
def bounded_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read and write goes through the bounded pass-throughs below: a loop that would
    never end fails the test instead."""
    chunked_preadv(monkeypatch, 1 << 30)
    chunked_pwrite(monkeypatch, 1 << 30)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DiskPool]:
    p = DiskPool(4, SLOT, str(tmp_path))
    yield p
    p.close()


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((seed * 37 + i * 11) % 251 for i in range(n))


def calls_bounded(limit: int) -> Callable[[], None]:
    """A counter that fails the test past ``limit`` calls: a loop that never ends is a failure."""
    count = 0

    def tick() -> None:
        nonlocal count
        count += 1
        if count > limit:
            pytest.fail(f"more than {limit} calls: the I/O loop does not end")

    return tick


def names_the_directory(info: pytest.ExceptionInfo[Any], directory: Path) -> None:
    assert str(directory) in str(info.value)


def oserror(code: int) -> Callable[..., Any]:
    def fail(*args: object) -> Any:
        raise OSError(code, os.strerror(code))

    return fail


# --- io_error ---------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_io_error_full_disk_is_disk_oom(code: int) -> None:
    e = disk_pool.io_error(OSError(code, "x"), "/some/dir")
    assert isinstance(e, DiskOOMError)
    assert str(e) == "disk tier: no space left in /some/dir"


@pytest.mark.parametrize(("code", "kind"), [(errno.EIO, OSError), (errno.ENOENT, FileNotFoundError)])
def test_io_error_keeps_the_errno_and_its_subclass(code: int, kind: type[OSError]) -> None:
    e = disk_pool.io_error(OSError(code, "x"), "/some/dir")
    assert type(e) is kind
    assert isinstance(e, OSError) and e.errno == code
    assert e.strerror == f"disk tier: {os.strerror(code)} in /some/dir"


def test_io_error_without_errno_is_eio() -> None:
    e = disk_pool.io_error(OSError("no errno"), "/d")
    assert isinstance(e, OSError) and e.errno == errno.EIO


# --- construction and resize --------------------------------------------------------------------


def fd_path(pool: DiskPool) -> str:
    return f"/proc/self/fd/{pool.fileno()}"


def test_new_pool_is_sized_names_its_directory_and_has_no_name_there(tmp_path: Path) -> None:
    """The file is unlinked from the start: the kernel frees it however the process ends."""
    p = DiskPool(3, SLOT, str(tmp_path))
    try:
        assert p.directory == str(tmp_path)
        assert p.size == 3 * SLOT and os.path.getsize(fd_path(p)) == 3 * SLOT
        assert list(tmp_path.iterdir()) == []
        assert os.readlink(fd_path(p)).startswith(str(tmp_path))
        assert os.fstat(p.fileno()).st_nlink == 0
    finally:
        p.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EISDIR])
def test_without_o_tmpfile_a_named_file_is_removed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    real_open = os.open

    def no_tmpfile(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, mode)

    monkeypatch.setattr("kv_core_py.disk_pool.os.open", no_tmpfile)
    p = DiskPool(2, SLOT, str(tmp_path))
    try:
        assert list(tmp_path.iterdir()) == []
        assert os.fstat(p.fileno()).st_nlink == 0
        p.write(1, memoryview(pattern(SLOT)))
        assert file_bytes(p)[SLOT:] == pattern(SLOT)
    finally:
        p.close()


@pytest.mark.parametrize(("code", "kind"), [(errno.ENOSPC, DiskOOMError), (errno.EIO, OSError)])
def test_a_failed_truncate_at_construction_names_the_directory_and_removes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, kind: type[Exception]
) -> None:
    monkeypatch.setattr("kv_core_py.disk_pool.os.ftruncate", oserror(code))
    with pytest.raises(kind) as info:
        DiskPool(4, SLOT, str(tmp_path))
    names_the_directory(info, tmp_path)
    if kind is OSError:
        assert isinstance(info.value, OSError) and info.value.errno == code
    assert list(tmp_path.iterdir()) == []


def test_resize_grows_and_cuts_the_file(pool: DiskPool) -> None:
    pool.resize(7)
    assert pool.size == 7 * SLOT and os.path.getsize(fd_path(pool)) == 7 * SLOT
    pool.resize(2)
    assert pool.size == 2 * SLOT and os.path.getsize(fd_path(pool)) == 2 * SLOT


@pytest.mark.parametrize(("code", "kind"), [(errno.EDQUOT, DiskOOMError), (errno.EIO, OSError)])
def test_a_failed_resize_names_the_directory_and_keeps_the_size(
    pool: DiskPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, kind: type[Exception]
) -> None:
    monkeypatch.setattr("kv_core_py.disk_pool.os.ftruncate", oserror(code))
    with pytest.raises(kind) as info:
        pool.resize(8)
    names_the_directory(info, tmp_path)
    if kind is OSError:
        assert isinstance(info.value, OSError) and info.value.errno == code
    assert pool.size == 4 * SLOT


# --- ensure_backed ------------------------------------------------------------------------------


def spy_fallocate(monkeypatch: pytest.MonkeyPatch, fail: int | None = None) -> list[tuple[int, int]]:
    """Records (offset, length) of each ``posix_fallocate``; fails each with ``fail`` if given."""
    seen: list[tuple[int, int]] = []

    def fallocate(fd: int, offset: int, length: int) -> None:
        seen.append((offset, length))
        if fail is not None:
            raise OSError(fail, os.strerror(fail))
        REAL_FALLOCATE(fd, offset, length)

    monkeypatch.setattr("kv_core_py.disk_pool.os.posix_fallocate", fallocate)
    return seen


def test_blocks_are_allocated_once_from_the_high_water_mark(pool: DiskPool, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = spy_fallocate(monkeypatch)
    pool.ensure_backed(1)
    pool.ensure_backed(1)  # already backed: no call
    pool.ensure_backed(3)
    pool.ensure_backed(3)
    pool.ensure_backed(2)  # below the mark
    assert seen == [(0, SLOT), (SLOT, 2 * SLOT)]


def test_a_cut_lowers_the_high_water_mark(pool: DiskPool, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = spy_fallocate(monkeypatch)
    pool.ensure_backed(4)
    pool.resize(1)
    pool.resize(4)
    pool.ensure_backed(4)
    assert seen == [(0, 4 * SLOT), (SLOT, 3 * SLOT)]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_at_allocation_is_disk_oom_and_not_backed(
    pool: DiskPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    seen = spy_fallocate(monkeypatch, fail=code)
    with pytest.raises(DiskOOMError) as info:
        pool.ensure_backed(1)
    names_the_directory(info, tmp_path)
    with pytest.raises(DiskOOMError):
        pool.ensure_backed(1)  # still not backed: tried again
    assert seen == [(0, SLOT), (0, SLOT)]


def test_another_allocation_failure_is_an_oserror_naming_the_directory(
    pool: DiskPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy_fallocate(monkeypatch, fail=errno.EIO)
    with pytest.raises(OSError) as info:
        pool.ensure_backed(2)
    assert not isinstance(info.value, DiskOOMError)
    assert info.value.errno == errno.EIO
    names_the_directory(info, tmp_path)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_no_fallocate_support_is_no_error(pool: DiskPool, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    seen = spy_fallocate(monkeypatch, fail=code)
    pool.ensure_backed(2)
    pool.ensure_backed(2)  # counted as backed: not tried again
    assert seen == [(0, 2 * SLOT)]
    pool.write(1, memoryview(pattern(SLOT)))  # the sparse file still takes the data
    out = bytearray(SLOT)
    pool.read(1, memoryview(out))
    assert bytes(out) == pattern(SLOT)


# --- read and write ------------------------------------------------------------------------------


def chunked_preadv(monkeypatch: pytest.MonkeyPatch, chunk: int, interrupt_every: int = 0) -> list[int]:
    """``preadv`` reading at most ``chunk`` bytes a call; with ``interrupt_every`` n, every n-th call
    raises ``InterruptedError`` first. Returns the offsets asked for."""
    offsets: list[int] = []
    tick = calls_bounded(1000)

    def preadv(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        tick()
        offsets.append(offset)
        if interrupt_every and len(offsets) % interrupt_every == 1:
            raise InterruptedError(errno.EINTR, "interrupted")
        return REAL_PREADV(fd, [memoryview(buffers[0])[:chunk]], offset)

    monkeypatch.setattr("kv_core_py.disk_pool.os.preadv", preadv)
    return offsets


def chunked_pwrite(monkeypatch: pytest.MonkeyPatch, chunk: int, interrupt_every: int = 0) -> list[tuple[int, int]]:
    """``pwrite`` writing at most ``chunk`` bytes a call (and failing any empty write); with
    ``interrupt_every`` n, every n-th call raises ``InterruptedError`` first. Returns the
    (offset, length) asked for."""
    seen: list[tuple[int, int]] = []
    tick = calls_bounded(1000)

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        tick()
        seen.append((offset, len(data)))
        assert len(data) > 0, "an empty write: the loop went past the end of the data"
        if interrupt_every and len(seen) % interrupt_every == 1:
            raise InterruptedError(errno.EINTR, "interrupted")
        return REAL_PWRITE(fd, memoryview(data)[:chunk], offset)

    monkeypatch.setattr("kv_core_py.disk_pool.os.pwrite", pwrite)
    return seen


def file_bytes(pool: DiskPool) -> bytes:
    with open(fd_path(pool), "rb") as f:
        return f.read()


def test_write_then_read_whole_slots(pool: DiskPool) -> None:
    data = pattern(2 * SLOT)
    pool.write(1, memoryview(data))
    assert file_bytes(pool) == bytes(SLOT) + data + bytes(SLOT)
    out = bytearray(2 * SLOT)
    assert pool.read(1, memoryview(out)) == []
    assert bytes(out) == data


def scribble(pool: DiskPool, offset: int, data: bytes) -> None:
    """Another process writing into the file behind the pool's back."""
    with open(fd_path(pool), "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_slot_changed_on_disk_fails_its_checksum(pool: DiskPool) -> None:
    pool.write(0, memoryview(pattern(4 * SLOT, seed=3)))
    scribble(pool, 2 * SLOT + 5, b"\xff")
    out = bytearray(4 * SLOT)
    assert pool.read(0, memoryview(out)) == [2]
    assert pool.read(1, memoryview(out)[: 2 * SLOT]) == [2]
    assert pool.read(3, memoryview(out)[:SLOT]) == []


def test_unwritten_forgotten_and_cut_slots_fail_their_checksum(pool: DiskPool) -> None:
    out = memoryview(bytearray(SLOT))
    assert pool.read(0, out) == [0]  # never written: zeros are no page
    pool.write(0, memoryview(pattern(4 * SLOT)))
    pool.forget(1)
    assert pool.read(1, out) == [1]
    pool.resize(2)
    pool.resize(4)
    assert pool.read(3, out) == [3]
    assert pool.read(0, out) == []


def test_a_failed_write_leaves_its_slots_unwritten(pool: DiskPool, monkeypatch: pytest.MonkeyPatch) -> None:
    pool.write(1, memoryview(pattern(SLOT)))
    monkeypatch.setattr("kv_core_py.disk_pool.os.pwrite", oserror(errno.EIO))
    with pytest.raises(OSError):
        pool.write(1, memoryview(pattern(SLOT, seed=2)))
    monkeypatch.undo()
    out = memoryview(bytearray(SLOT))
    assert pool.read(1, out) == [1]


@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_short_writes_are_resumed_where_they_stopped(
    pool: DiskPool, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    data = pattern(2 * SLOT, seed=5)
    seen = chunked_pwrite(monkeypatch, chunk)
    pool.write(1, memoryview(data))
    assert file_bytes(pool) == bytes(SLOT) + data + bytes(SLOT)
    assert seen[0] == (SLOT, 2 * SLOT)
    assert seen == [(SLOT + done, 2 * SLOT - done) for done in range(0, 2 * SLOT, chunk)]


@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_short_reads_are_resumed_where_they_stopped(
    pool: DiskPool, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    data = pattern(4 * SLOT, seed=7)
    pool.write(0, memoryview(data))
    offsets = chunked_preadv(monkeypatch, chunk)
    out = bytearray(2 * SLOT)
    pool.read(2, memoryview(out))
    assert bytes(out) == data[2 * SLOT :]
    assert offsets == [2 * SLOT + done for done in range(0, 2 * SLOT, chunk)]


def test_an_interrupted_write_is_retried(pool: DiskPool, monkeypatch: pytest.MonkeyPatch) -> None:
    data = pattern(SLOT, seed=9)
    seen = chunked_pwrite(monkeypatch, 6, interrupt_every=2)
    pool.write(2, memoryview(data))
    assert file_bytes(pool)[2 * SLOT : 3 * SLOT] == data
    # interrupted, 6 bytes, interrupted, 6 bytes, interrupted, 4 bytes
    assert [offset for offset, _ in seen] == [2 * SLOT + d for d in (0, 0, 6, 6, 12, 12)]


def test_an_interrupted_read_is_retried(pool: DiskPool, monkeypatch: pytest.MonkeyPatch) -> None:
    data = pattern(SLOT, seed=11)
    pool.write(3, memoryview(data))
    offsets = chunked_preadv(monkeypatch, 6, interrupt_every=2)
    out = bytearray(SLOT)
    pool.read(3, memoryview(out))
    assert bytes(out) == data
    assert offsets == [3 * SLOT + d for d in (0, 0, 6, 6, 12, 12)]


def test_reading_past_the_end_of_the_file_is_eio(pool: DiskPool, tmp_path: Path) -> None:
    pool.write(3, memoryview(pattern(SLOT)))
    pool.resize(3)  # slot 3 and its data are gone
    out = bytearray(SLOT)
    with pytest.raises(OSError, match=f"^.*unexpected end of file in {re.escape(str(tmp_path))}$") as info:
        pool.read(3, memoryview(out))
    assert info.value.errno == errno.EIO
    assert info.value.strerror == f"disk tier: unexpected end of file in {tmp_path}"


def test_a_read_cut_short_by_the_end_of_the_file_is_eio(pool: DiskPool) -> None:
    pool.resize(3)
    out = bytearray(2 * SLOT)
    with pytest.raises(OSError) as info:
        pool.read(2, memoryview(out))  # one slot there, the next one not
    assert info.value.errno == errno.EIO


@pytest.mark.parametrize(("code", "kind"), [(errno.ENOSPC, DiskOOMError), (errno.EIO, OSError)])
def test_a_failed_write_names_the_directory(
    pool: DiskPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, kind: type[Exception]
) -> None:
    monkeypatch.setattr("kv_core_py.disk_pool.os.pwrite", oserror(code))
    with pytest.raises(kind) as info:
        pool.write(0, memoryview(pattern(SLOT)))
    names_the_directory(info, tmp_path)
    if kind is OSError:
        assert isinstance(info.value, OSError) and info.value.errno == code


@pytest.mark.parametrize("code", [errno.EIO, errno.EBADF])
def test_a_failed_read_names_the_directory(
    pool: DiskPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr("kv_core_py.disk_pool.os.preadv", oserror(code))
    with pytest.raises(OSError) as info:
        pool.read(0, memoryview(bytearray(SLOT)))
    assert info.value.errno == code
    assert info.value.strerror == f"disk tier: {os.strerror(code)} in {tmp_path}"


def test_a_long_run_moves_in_chunks_of_whole_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs move in calls of about ``CHUNK_BYTES`` (whole slots), each checked while in cache;
    a corrupt slot in the second chunk is found where it is."""
    size = disk_pool.CHUNK_BYTES // 2 + 16  # one slot a chunk
    p = DiskPool(5, size, str(tmp_path))
    try:
        data = pattern(5 * size, seed=4)
        writes = chunked_pwrite(monkeypatch, 1 << 30)
        p.write(0, memoryview(data))
        assert writes == [(s * size, size) for s in range(5)]
        small = DiskPool(8, disk_pool.CHUNK_BYTES // 4, str(tmp_path))  # four slots a chunk
        writes.clear()
        small.write(0, memoryview(bytes(8 * small.slot_size)))
        assert writes == [(0, disk_pool.CHUNK_BYTES), (disk_pool.CHUNK_BYTES, disk_pool.CHUNK_BYTES)]
        small.close()
        scribble(p, 3 * size + 7, b"!")
        reads = chunked_preadv(monkeypatch, 1 << 30)
        out = bytearray(4 * size)
        assert p.read(1, memoryview(out)) == [3]
        assert reads == [s * size for s in range(1, 5)]
        assert bytes(out[: 2 * size]) == data[size : 3 * size]
    finally:
        p.close()
