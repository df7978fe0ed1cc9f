"""A disk pool: one sparse, unlinked file of slots, moved with positioned I/O, each slot checked
against the checksum of what was written there (docs/manager.md, "Eviction and tiers")."""

from __future__ import annotations

import errno
import os
import tempfile
import weakref
import zlib
from array import array

from kv_api.errors import DiskOOMError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def io_error(e: OSError, directory: str) -> Exception:
    """``DiskOOMError`` for a full disk, else an ``OSError`` (of the errno's subclass) naming the tier."""
    code = e.errno or errno.EIO
    if code in _NO_SPACE:
        return DiskOOMError(f"disk tier: no space left in {directory}")
    return OSError(code, f"disk tier: {os.strerror(code)} in {directory}")


#: About how many bytes one read or write system call moves (see ``DiskPool._chunk``).
CHUNK_BYTES = 512 * 1024

#: The checksum of a slot never written (or cut off by a resize): no page matches it.
_UNWRITTEN = 0xFFFFFFFF_FFFFFFFF


def open_unlinked(directory: str) -> int:
    """A new file in ``directory`` that no name points to, so the kernel frees its space when
    the last descriptor closes, however the process ends: ``O_TMPFILE`` where the file system
    has it, else a named file removed at once (``kvcore-XXXXXX.pages`` for an instant)."""
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    fd, path = tempfile.mkstemp(prefix="kvcore-", suffix=".pages", dir=directory)
    try:
        os.unlink(path)
    except OSError:
        os.close(fd)
        raise
    return fd


def checksum(data: memoryview) -> int:
    """A slot's checksum: CRC-32 (zlib's, the fastest the standard library has); the native
    backend uses CRC-32C. Checksums never leave the process, so the two need not agree."""
    return zlib.crc32(data)


class DiskPool:
    """``num_slots * slot_size`` bytes of an unlinked file in ``directory``, freed by ``close()``
    (or when the pool is collected, or the process ends). The file stays sparse: blocks are
    allocated for slots below the high-water mark only, before they are first written
    (``ensure_backed``), so a full disk is found before anything moves. Each slot's checksum is
    kept in memory when it is written and checked when it is read: bytes changed on disk (by
    another process, a failing device) are never taken for a page."""

    def __init__(self, num_slots: int, slot_size: int, directory: str) -> None:
        self.slot_size = slot_size
        self.size = num_slots * slot_size
        self.directory = directory
        try:
            self._fd = open_unlinked(directory)
        except OSError as e:
            raise io_error(e, directory) from None
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        try:
            os.ftruncate(self._fd, self.size)
        except OSError as e:
            self._finalizer()
            raise io_error(e, directory) from None
        self._backed = 0  # slots below this have blocks allocated
        self._sums = array("Q")  # per slot below the high-water mark: grows with the slots in use

    @property
    def backed(self) -> int:
        """Slots below this have their blocks allocated."""
        return self._backed

    def forget(self, slot: int) -> None:
        """``slot`` holds no page that can be read back (a corrupt page copied into it)."""
        if slot < len(self._sums):
            self._sums[slot] = _UNWRITTEN

    def _grow_sums(self, num_slots: int) -> None:
        if len(self._sums) < num_slots:
            self._sums.extend(array("Q", [_UNWRITTEN]) * (num_slots - len(self._sums)))

    def fileno(self) -> int:
        """The file's descriptor (tests read the file through ``/proc/self/fd``)."""
        return self._fd

    def resize(self, num_slots: int) -> None:
        """Grow or cut the file to ``num_slots`` slots (slots beyond it hold nothing)."""
        try:
            os.ftruncate(self._fd, num_slots * self.slot_size)
        except OSError as e:
            raise io_error(e, self.directory) from None
        self.size = num_slots * self.slot_size
        self._backed = min(self._backed, num_slots)
        del self._sums[num_slots:]

    def close(self) -> None:
        self._finalizer()

    def ensure_backed(self, num_slots: int) -> None:
        """Allocate the file's blocks for slots below ``num_slots``; ``DiskOOMError`` if the disk is full."""
        if num_slots <= self._backed:
            return
        try:
            os.posix_fallocate(self._fd, self._backed * self.slot_size, (num_slots - self._backed) * self.slot_size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise io_error(e, self.directory) from None
        self._backed = num_slots
        self._grow_sums(num_slots)

    def _chunk(self) -> int:
        """Bytes moved per system call: whole slots, about ``CHUNK_BYTES``, so a slot is
        checksummed while the cache still holds what the call copied."""
        return max(1, CHUNK_BYTES // self.slot_size) * self.slot_size

    def read(self, slot: int, into: memoryview) -> list[int]:
        """Fill ``into`` (whole slots) from the file, starting at ``slot``; the slots whose
        bytes do not match the checksum of what was written there (none: an empty list)."""
        size, chunk, corrupt = self.slot_size, self._chunk(), []
        for at in range(0, len(into), chunk):
            part = into[at : at + chunk]
            self._read_all(part, slot * size + at)
            first = slot + at // size
            corrupt += [
                first + i
                for i in range(len(part) // size)
                if first + i >= len(self._sums) or checksum(part[i * size : (i + 1) * size]) != self._sums[first + i]
            ]
        return corrupt

    def write(self, slot: int, data: memoryview) -> None:
        """Write ``data`` (whole slots) to the file, starting at ``slot``, and note each slot's
        checksum (a failed write leaves its slots unwritten)."""
        size, chunk = self.slot_size, self._chunk()
        count = len(data) // size
        self._grow_sums(slot + count)
        self._sums[slot : slot + count] = array("Q", [_UNWRITTEN]) * count
        sums = array("Q")
        for at in range(0, len(data), chunk):
            part = data[at : at + chunk]
            sums.extend(checksum(part[i * size : (i + 1) * size]) for i in range(len(part) // size))
            self._write_all(part, slot * size + at)
        self._sums[slot : slot + count] = sums

    def _read_all(self, into: memoryview, offset: int) -> None:
        done = 0
        while done < len(into):
            try:
                n = os.preadv(self._fd, [into[done:]], offset + done)
            except InterruptedError:
                continue
            except OSError as e:
                raise io_error(e, self.directory) from None
            if n == 0:
                raise OSError(errno.EIO, f"disk tier: unexpected end of file in {self.directory}")
            done += n

    def _write_all(self, data: memoryview, offset: int) -> None:
        done = 0
        while done < len(data):
            try:
                done += os.pwrite(self._fd, data[done:], offset + done)
            except InterruptedError:
                continue
            except OSError as e:
                raise io_error(e, self.directory) from None
