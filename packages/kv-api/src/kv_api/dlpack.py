"""Tensors as buffers: a CPU DLPack tensor (``torch``, ``numpy``, ...) viewed as a memoryview.

Calls that take an index buffer (``KVCache.set_base_page_index_buf``,
``PageIndexConverter.convert_into``) accept any object exporting the buffer protocol, and also
any object with ``__dlpack__`` (a torch tensor has no buffer protocol). ``as_buffer`` views such
a tensor in place, without numpy or torch: it reads the DLPack capsule's ``DLTensor`` (the
layout of the DLPack standard's ``dlpack.h``, version 0.x "dltensor" capsules) and keeps the
capsule, so the producer keeps the memory, for as long as the view lives.
"""

from __future__ import annotations

import ctypes
from typing import Any, cast

__all__ = ["as_buffer"]

_KDL_CPU = 1
_KDL_INT = 0
_KDL_UINT = 1
#: DLPack (type code, bits) to struct format characters.
_FORMATS = {(_KDL_INT, 32): "i", (_KDL_INT, 64): "q", (_KDL_UINT, 8): "B", (_KDL_INT, 8): "b"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def as_buffer(obj: Any, what: str) -> memoryview | None:
    """``memoryview(obj)``, or for a DLPack tensor a view of its memory (1-D, C-contiguous, on
    the CPU, an integer or byte dtype); None for an object that is neither (the caller says what
    it expected). A tensor that is not 1-D, contiguous or on the CPU, or whose export fails, is a
    ``ValueError`` naming ``what``."""
    try:
        return memoryview(obj)
    except TypeError:
        pass
    export = getattr(obj, "__dlpack__", None)
    if export is None:
        return None
    try:
        capsule = export()
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:  # torch refuses tensors needing grad
        raise ValueError(f"{what}: {type(obj).__name__}.__dlpack__() failed: {exc}") from None
    if not _is_valid(capsule, b"dltensor"):
        raise ValueError(f"{what}: {type(obj).__name__}.__dlpack__() did not return a DLPack capsule")
    t = _DLTensor.from_address(_get_pointer(capsule, b"dltensor"))
    if t.device.device_type != _KDL_CPU:
        raise ValueError(f"{what}: the tensor must be on the CPU (DLPack device type {t.device.device_type})")
    if t.ndim != 1:
        raise ValueError(f"{what}: the tensor must be 1-D (got {t.ndim} dimensions)")
    n = t.shape[0]
    if t.strides and n > 1 and t.strides[0] != 1:
        raise ValueError(f"{what}: must be contiguous")
    fmt = _FORMATS.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if fmt is None:
        code, bits = t.dtype.code, t.dtype.bits
        raise ValueError(f"{what}: unsupported tensor dtype (DLPack code {code}, {bits} bits)")
    ctype = {"i": ctypes.c_int32, "q": ctypes.c_int64, "B": ctypes.c_uint8, "b": ctypes.c_int8}[fmt]
    cells: Any = (ctype * n).from_address((t.data or 0) + t.byte_offset) if n else (ctype * 0)()
    cells.capsule = capsule  # the producer frees the memory when the capsule goes
    view: memoryview = memoryview(cells).cast("B").cast(cast(Any, fmt))
    return view
