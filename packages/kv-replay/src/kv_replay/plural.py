"""Counts as people write them: ``1 instance``, ``2 instances``, ``1,024 layers``."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` (with thousands separators) and ``noun``, or ``many`` (default: ``noun + "s"``)
    unless the count is exactly one."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"
