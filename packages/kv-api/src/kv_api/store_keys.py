"""The keys a remote tier hands a ``BlockStore`` (docs/store.md): a chain's consecutive blocks'
store keys, each built where it is read. A cold admission asks about every block of its prompt
(thousands) and a store usually reads the first few; both backends pass this same class, so a
store sees the same object whichever backend calls it."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import overload

__all__ = ["StoreKeys"]

_DIGEST = 32  # a block's chained key


class StoreKeys(Sequence[bytes]):
    """``namespace`` + each 32-byte chained key in ``digests`` (concatenated), as a read-only
    sequence of ``bytes``: indexing builds one key, a slice a list of them, and the sequence
    compares equal to a list or tuple of the same keys."""

    __slots__ = ("_digests", "_namespace")

    def __init__(self, namespace: bytes, digests: bytes) -> None:
        if len(digests) % _DIGEST:
            raise ValueError(f"digests: {len(digests)} bytes is not a whole number of {_DIGEST}-byte keys")
        self._namespace = bytes(namespace)
        self._digests = bytes(digests)

    def __len__(self) -> int:
        return len(self._digests) // _DIGEST

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self._key(i) for i in range(*index.indices(len(self)))]
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"StoreKeys indices must be integers or slices, not {type(index).__name__}") from None
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("StoreKeys index out of range")
        return self._key(i)

    def __iter__(self) -> Iterator[bytes]:
        return (self._key(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StoreKeys):
            return (self._namespace, self._digests) == (other._namespace, other._digests)
        if isinstance(other, list | tuple):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which do not hash

    def __repr__(self) -> str:
        return f"StoreKeys({len(self)} keys under {self._namespace!r})"

    def _key(self, i: int) -> bytes:
        return self._namespace + self._digests[i * _DIGEST : (i + 1) * _DIGEST]
