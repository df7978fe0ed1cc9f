"""``kvcore replay --quota-curve``: the hit rate at every device quota, estimated from one replay
at an unbounded quota and the stack distances of its reused blocks (``kv_replay.stack_recorder``),
where a capacity sweep (``--quota 256M,1G,...``) replays once per quota.

A reused block would still have been cached at a quota of ``C`` slots if its distance is at most
``C``; the tokens of full blocks reused at every quota are the unbounded replay's, times the share
of sampled reused blocks within ``C`` (a ratio estimate: exact where nothing is sampled out, and
equal to the unbounded replay's hit rate once ``C`` holds every distance). A request's tokens
reused beyond its last full block count at its deepest sampled block's distance.

Below the most slots the unbounded replay ever held in use at once, a replay at that quota makes
requests wait or preempts them, so its schedule, which the estimate assumes, differs: the report
marks those quotas, and its rows start at most one power of two below that peak.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kv_replay.grid import grid
from kv_replay.report import SUMMARY_SCHEMA
from kv_replay.sizes import format_size
from kv_replay.stack_recorder import StackRecorder
from kv_replay.trace import Request

#: Blocks the recorder follows, about: the rate samples down to it (its Python work is per
#: sampled block). On the Mooncake trace (1.9 million blocks) every hit rate of the estimate is
#: within 0.5 point of a replay at that quota (docs/performance.md, "Capacity curve").
SAMPLED_BLOCKS = 1 << 17
#: The estimate's rows start at most this many doublings below the quota that holds every distance.
DOUBLINGS = 9

_Floats = np.ndarray[Any, np.dtype[np.float64]]

#: What was replayed, as a summary names it: trace, backend, layout.
_NAMED = ("trace", "backend", "layers", "num_layers", "tokens_per_block", "bytes_per_token")
#: JSON Schema of ``kvcore replay --quota-curve --json``.
CURVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [*_NAMED, "quota_curve", "unbounded", "peak_in_use_slots", "sample_rate", "sampled_blocks", "seconds"],
    "properties": {
        **{k: SUMMARY_SCHEMA["properties"][k] for k in _NAMED},
        "quota_curve": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["quota", "slots", "hit_rate", "below_peak_in_use"],
                "properties": {
                    "quota": {"type": "integer", "minimum": 1},
                    "slots": {"type": "integer", "minimum": 1},
                    "hit_rate": {"type": "number", "minimum": 0, "maximum": 1},
                    "below_peak_in_use": {"type": "boolean"},
                },
                "additionalProperties": False,
            },
        },
        "unbounded": SUMMARY_SCHEMA,
        "peak_in_use_slots": {"type": "integer", "minimum": 0},
        "sample_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "sampled_blocks": {"type": "integer", "minimum": 0},
        "seconds": {"type": "number", "minimum": 0},
    },
    "additionalProperties": False,
}


def sample_rate(requests: Sequence[Request], tokens_per_block: int) -> float:
    """The share of blocks to follow: all of them up to ``SAMPLED_BLOCKS``."""
    blocks = sum((r.prompt_length + len(r.output)) // tokens_per_block for r in requests)
    return min(1.0, SAMPLED_BLOCKS / blocks) if blocks else 1.0


def _slots(distances: Sequence[int], rate: float) -> _Floats:
    """Sampled distances as device slots: in use 0, unknown never."""
    d = np.asarray(distances, dtype=np.float64)
    return np.where(d == 0, 0.0, np.where(d < 0, np.inf, (d - 1) / rate + 1))


@dataclass(frozen=True)
class QuotaCurve:
    """Reused tokens as a function of the device's slots."""

    prompt_tokens: int  # every request's (the hit rate's denominator)
    reused_full_tokens: int  # in full blocks, at first starts, by the unbounded replay
    full: _Floats  # slots each sampled reused block needs, sorted
    partial: _Floats  # slots each request's reuse past its last full block needs, sorted
    partial_tokens: _Floats  # those tokens, cumulated in the same order
    rate: float

    @classmethod
    def of(cls, recorder: StackRecorder, prompt_tokens: int) -> QuotaCurve:
        partial = _slots([d for d, _ in recorder.partial], recorder.rate)
        order = np.argsort(partial, kind="stable")
        tokens = np.asarray([t for _, t in recorder.partial], dtype=np.float64)[order]
        full = np.sort(_slots(recorder.distances, recorder.rate))
        return cls(prompt_tokens, recorder.reused_full_tokens, full, partial[order], np.cumsum(tokens), recorder.rate)

    @property
    def sampled_blocks(self) -> int:
        return len(self.full)

    def reused_tokens(self, slots: int) -> float:
        """Tokens reused at first starts with ``slots`` device slots."""
        full = 0.0
        if len(self.full):
            full = self.reused_full_tokens * int(np.searchsorted(self.full, slots, side="right")) / len(self.full)
        within = int(np.searchsorted(self.partial, slots, side="right"))
        return full + (float(self.partial_tokens[within - 1]) if within else 0.0)

    def hit_rate(self, slots: int) -> float:
        return self.reused_tokens(slots) / self.prompt_tokens if self.prompt_tokens else 0.0

    def slots_for_all(self) -> int:
        """The fewest slots every known distance fits in (0: nothing reused)."""
        finite = [a[np.isfinite(a)] for a in (self.full, self.partial)]
        return int(max((float(a[-1]) for a in finite if len(a)), default=0.0))


def curve_quotas(curve: QuotaCurve, slot_bytes: int, asked: Sequence[int], peak_in_use: int = 0) -> list[int]:
    """The quotas the estimate is given at: powers of two up to the one that holds every
    distance, from ``DOUBLINGS`` below it or the one at or below ``peak_in_use`` slots, whichever
    is larger; and the ``--quota`` values."""
    top = curve.slots_for_all() * slot_bytes
    grid: list[int] = []
    if top:
        high = 1 << (top - 1).bit_length()
        low = max(high >> DOUBLINGS, 1 << max(peak_in_use * slot_bytes, 1).bit_length() - 1, slot_bytes)
        grid = [high >> k for k in range(DOUBLINGS, -1, -1) if high >> k >= low]
    return sorted({*grid, *asked})


def curve_report(
    curve: QuotaCurve,
    quotas: Sequence[int],
    slots_of: Callable[[int], int],
    unbounded: dict[str, Any],
    peak_in_use: int,
    named: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    """The estimate at each quota (``slots_of``: the device slots a quota gives), the replay it
    came from (``unbounded``, its summary, and the most slots it held in use) and the time it took."""
    points = []
    for quota in quotas:
        slots = slots_of(quota)
        below = slots < peak_in_use
        points.append({"quota": quota, "slots": slots, "hit_rate": curve.hit_rate(slots), "below_peak_in_use": below})
    return {
        **named,
        "quota_curve": points,
        "unbounded": unbounded,
        "peak_in_use_slots": peak_in_use,
        "sample_rate": curve.rate,
        "sampled_blocks": curve.sampled_blocks,
        "seconds": seconds,
    }


def curve_table(report: dict[str, Any]) -> str:
    rows = [("quota", "slots", "hit rate (estimated)")]
    for p in report["quota_curve"]:  # a mark, or as wide a space: the rates stay aligned
        mark = " *" if p["below_peak_in_use"] else "  "
        rows.append((format_size(p["quota"]), f"{p['slots']:,}", f"{p['hit_rate']:.2%}{mark}"))
    rows.append(("unbounded (replayed)", "", f"{report['unbounded']['hit_rate']:.2%}  "))
    lines = grid(rows, left=1)
    rate = report["sample_rate"]
    sampled = "every block" if rate >= 1.0 else f"{report['sampled_blocks']:,} reused blocks sampled ({rate:.1%})"
    lines.append(f"\nfrom one replay at an unbounded quota, {sampled}: {report['seconds']:.1f} s")
    if any(p["below_peak_in_use"] for p in report["quota_curve"]):
        lines.append(
            f"* fewer slots than that replay held in use at its peak ({report['peak_in_use_slots']:,}): there "
            "requests wait or are preempted, which the estimate does not follow"
        )
    return "\n".join(lines)
