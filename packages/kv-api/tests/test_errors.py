"""One exception hierarchy (docs/errors.md)."""

from __future__ import annotations

from kv_api import errors


def test_hierarchy() -> None:
    assert issubclass(errors.OutOfPagesError, errors.CacheCapacityError)
    assert issubclass(errors.OutOfMemoryError, errors.CacheCapacityError)
    assert issubclass(errors.HostOOMError, errors.OutOfMemoryError)
    assert issubclass(errors.DiskOOMError, errors.OutOfMemoryError)
    assert issubclass(errors.InvalidStateError, errors.LogicError)
    assert not issubclass(errors.CorruptedError, errors.LogicError)
    assert issubclass(errors.BackendError, ImportError)
