"""A disk pool: one sparse file of slots, moved with positioned I/O (docs/manager.md, "Eviction
and tiers")."""

from __future__ import annotations

import errno
import os
import tempfile
import weakref

from kv_api.errors import DiskOOMError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def io_error(e: OSError, directory: str) -> Exception:
    """``DiskOOMError`` for a full disk, else an ``OSError`` (of the errno's subclass) naming the tier."""
    code = e.errno or errno.EIO
    if code in _NO_SPACE:
        return DiskOOMError(f"disk tier: no space left in {directory}")
    return OSError(code, f"disk tier: {os.strerror(code)} in {directory}")


def _remove(fd: int, path: str) -> None:
    os.close(fd)
    try:
        os.unlink(path)
    except OSError:
        pass  # the directory went away under us: nothing left to remove


class DiskPool:
    """``num_slots * slot_size`` bytes of a file created in ``directory``, removed by ``close()``
    (or when the pool is collected). The file stays sparse: blocks are allocated for slots
    below the high-water mark only, before they are first written (``ensure_backed``), so a full
    disk is found before anything moves."""

    def __init__(self, num_slots: int, slot_size: int, directory: str) -> None:
        self.slot_size = slot_size
        self.size = num_slots * slot_size
        self.directory = directory
        try:
            self._fd, self.path = tempfile.mkstemp(prefix="kvcore-", suffix=".pages", dir=directory)
        except OSError as e:
            raise io_error(e, directory) from None
        self._finalizer = weakref.finalize(self, _remove, self._fd, self.path)
        try:
            os.ftruncate(self._fd, self.size)
        except OSError as e:
            self._finalizer()
            raise io_error(e, directory) from None
        self._backed = 0  # slots below this have blocks allocated

    def resize(self, num_slots: int) -> None:
        """Grow or cut the file to ``num_slots`` slots (slots beyond it hold nothing)."""
        try:
            os.ftruncate(self._fd, num_slots * self.slot_size)
        except OSError as e:
            raise io_error(e, self.directory) from None
        self.size = num_slots * self.slot_size
        self._backed = min(self._backed, num_slots)

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

    def read(self, slot: int, into: memoryview) -> None:
        """Fill ``into`` from the file, starting at ``slot``."""
        offset, done = slot * self.slot_size, 0
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

    def write(self, slot: int, data: memoryview) -> None:
        """Write ``data`` to the file, starting at ``slot``."""
        offset, done = slot * self.slot_size, 0
        while done < len(data):
            try:
                done += os.pwrite(self._fd, data[done:], offset + done)
            except InterruptedError:
                continue
            except OSError as e:
                raise io_error(e, self.directory) from None
