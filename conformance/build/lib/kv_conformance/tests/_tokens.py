"""Every input container the key functions accept, built from one list of int ids."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np


def _strided(ids: list[int], dtype: Any) -> Any:
    wide = np.zeros(2 * len(ids), dtype=dtype)
    wide[::2] = ids
    return wide[::2]  # a non-contiguous view


INT_CONTAINERS: dict[str, Callable[[list[int]], Any]] = {
    "list": list,
    "tuple": tuple,
    "generator": lambda ids: (t for t in ids),
    "array_i": lambda ids: array("i", ids),
    "array_q": lambda ids: array("q", ids),
    "array_I": lambda ids: array("I", ids),
    "numpy_int32": lambda ids: np.asarray(ids, dtype=np.int32),
    "numpy_int64": lambda ids: np.asarray(ids, dtype=np.int64),
    "numpy_uint64": lambda ids: np.asarray(ids, dtype=np.uint64),
    "numpy_int32_strided": lambda ids: _strided(ids, np.int32),
    "numpy_int64_reversed": lambda ids: np.asarray(ids[::-1], dtype=np.int64)[::-1],
    "memoryview": lambda ids: memoryview(array("i", ids)),
    "numpy_scalars": lambda ids: [np.int64(t) for t in ids],
}
