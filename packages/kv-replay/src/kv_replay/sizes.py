"""Byte sizes as people write them: ``268435456``, ``256M``, ``1G``, ``512MiB``, ``1.5T``."""

from __future__ import annotations

import re

_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50}
_SIZE = re.compile(r"^(\d{1,30})(?:\.(\d{1,9}))?\s*([KMGTP]?)(?:i?B)?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes; ``ValueError`` for anything else (binary units: 1K = 1024). A fraction must come
    to whole bytes."""
    m = _SIZE.match(text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 268435456, 256M, 1G, 1.5T)")
    whole, fraction, unit = m.group(1), m.group(2) or "", m.group(3).upper()
    size, rest = divmod(int(whole + fraction) << _UNITS[unit], 10 ** len(fraction))
    assert isinstance(size, int)
    if rest:
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return size


def format_size(n: int) -> str:
    """The shortest exact form with a binary unit (``1G``, ``1536M``), or bytes."""
    for unit in "PTGMK":
        shift = _UNITS[unit]
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def human_size(n: int) -> str:
    """A size for people to read: ``512 B``, ``4.0 KiB``, ``1.2 GiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.1f} {unit}"
