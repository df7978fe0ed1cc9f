"""Text tables: aligned columns and a rule under the header."""

from __future__ import annotations

from collections.abc import Sequence


def grid(rows: Sequence[Sequence[str]], left: int) -> list[str]:
    """Aligned text rows, a rule under the header: the first ``left`` columns flush left, the
    others flush right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = [
        "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out
