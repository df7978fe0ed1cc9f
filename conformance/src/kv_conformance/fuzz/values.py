"""The names a fuzz case's source may use besides the fixture's objects: hostile objects, odd
buffers, forged scopes. A case is one line of Python over these names, so that it is printable
and runs again as is (``python -m kv_conformance.fuzz --repro "<source>"``)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from kv_api import (
    CacheTier,
    KVCacheStatus,
    MmItemContext,
    PageIndexMode,
    PageStatus,
    ReuseScope,
)
from kv_conformance.tests.test_tokens_hostile import hostile

__all__ = [
    "Boom",
    "CacheTier",
    "Decimal",
    "Fraction",
    "IndexCalls",
    "IndexReturns",
    "IntSub",
    "KVCacheStatus",
    "LiesLen",
    "MmItemContext",
    "PageIndexMode",
    "PageStatus",
    "RaisesBool",
    "RaisesEq",
    "RaisesHash",
    "RaisesIndex",
    "RaisesIter",
    "RaisesLen",
    "ReuseScope",
    "StopsMidway",
    "StrSub",
    "arr",
    "array",
    "forged_scope",
    "gen",
    "hostile",
    "inf",
    "namespace",
    "nan",
    "np",
]

inf = math.inf
nan = math.nan


class Boom(Exception):
    """What hostile objects raise: a class no backend raises itself, so it must propagate as is."""


class RaisesIndex:
    def __index__(self) -> int:
        raise Boom("__index__")

    def __repr__(self) -> str:
        return "RaisesIndex()"


class IndexReturns:
    """``__index__`` returns ``value``, which may be no int (Python then raises TypeError)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __index__(self) -> Any:
        return self.value


class IndexCalls:
    """A token whose ``__index__`` calls ``hook`` (a re-entrant call into the manager) first."""

    def __init__(self, hook: Callable[[], object], value: int) -> None:
        self.hook, self.value = hook, value

    def __index__(self) -> int:
        self.hook()
        return self.value


class RaisesLen:
    """Iterates as ``[1, 2, 3]`` but its ``__len__`` raises."""

    def __len__(self) -> int:
        raise Boom("__len__")

    def __iter__(self) -> Iterator[int]:
        return iter([1, 2, 3])


class LiesLen:
    """``__len__`` says ``n``; iteration yields three ids."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter([1, 2, 3])


class RaisesIter:
    def __iter__(self) -> Iterator[int]:
        raise Boom("__iter__")


class StopsMidway:
    """Yields two ids, then raises."""

    def __iter__(self) -> Iterator[int]:
        yield 1
        yield 2
        raise Boom("__next__")


class RaisesBool:
    def __bool__(self) -> bool:
        raise Boom("__bool__")


class RaisesHash:
    def __hash__(self) -> int:
        raise Boom("__hash__")


class RaisesEq:
    def __eq__(self, other: object) -> bool:
        raise Boom("__eq__")

    __hash__ = object.__hash__


class IntSub(int):
    pass


class StrSub(str):
    pass


def gen(items: list[Any]) -> Iterator[Any]:
    """A one-shot iterator over ``items`` (no ``__len__``)."""
    return (t for t in items)


def arr(dtype: str, shape: tuple[int, ...] = (4,), *, fill: Any = 0, step: int = 1, readonly: bool = False) -> Any:
    """A numpy array of ``dtype`` and ``shape`` filled with ``fill`` (``"arange"`` counts up), every
    ``step``-th element of a larger one along the first axis (negative: reversed), maybe read-only."""
    full = (shape[0] * abs(step), *shape[1:]) if shape else shape
    a = np.arange(math.prod(full)).reshape(full).astype(dtype) if fill == "arange" else np.full(full, fill, dtype)
    if shape:
        a = a[::step]
    a.setflags(write=not readonly)
    return a


def forged_scope(lora_id: Any, salt: Any) -> ReuseScope:
    """A ``ReuseScope`` whose fields skipped its own validation (a backend must not trust them)."""
    scope = object.__new__(ReuseScope)
    object.__setattr__(scope, "lora_id", lora_id)
    object.__setattr__(scope, "salt", salt)
    return scope


def namespace() -> dict[str, Any]:
    """The names a case's source may use (the fixture adds its objects)."""
    return {name: globals()[name] for name in __all__ if name != "namespace"}
