"""Argument checks shared by the data types, with messages that name the field and the rule."""

from __future__ import annotations

import math
import operator
from typing import Any

U64_LIMIT = 1 << 64


def as_int(where: str, value: Any) -> int:
    """Return ``value`` as an int; bool and non-integers are a ``TypeError``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{where}: expected an int, got {type(value).__name__}")
    return operator.index(value)


def as_str(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where}: expected a str, got {type(value).__name__}")
    return value


def int_in_range(where: str, value: Any, low: int, high: int | None = None) -> int:
    """An int with ``low <= value`` (and ``value < high`` when given)."""
    v = as_int(where, value)
    if v < low or (high is not None and v >= high):
        rule = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{where}: must be {rule} (got {v})")
    return v


def optional_u64(where: str, value: Any) -> int | None:
    if value is None:
        return None
    return int_in_range(where, value, 0, U64_LIMIT)


def timeout_ms(where: str, value: Any) -> float | None:
    """None (wait without limit) or a real number that is not NaN; values <= 0 do not wait and
    +inf waits as None does."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: expected a number or None, got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond any float: an endless wait, or none
        v = math.inf if value > 0 else -math.inf
    if math.isnan(v):
        raise ValueError(f"{where}: must not be NaN")
    return None if v == math.inf else max(v, 0.0)


def unit_interval(where: str, value: Any) -> float:
    """A real number in (0, 1]; NaN is rejected."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: expected a number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or not 0.0 < v <= 1.0:
        # "<field> must be in" is the reference's phrase; code written against it matches on it.
        field = where.rpartition(".")[2]
        raise ValueError(f"{where}: {field} must be in (0, 1] (got {value!r})")
    return v
