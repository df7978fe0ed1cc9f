"""What a replay reports: the summary (table or JSON, schema in docs/replay.md) and the
side-by-side comparison of backends."""

from __future__ import annotations

from typing import Any

from kv_replay.replayer import ReplayResult

#: JSON Schema of ``kvcore replay --json`` (one summary) and ``--json --compare`` (several).
SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "backend",
        "requests",
        "completed",
        "rejected",
        "preemptions",
        "prompt_tokens",
        "reused_tokens",
        "hit_rate",
        "evictions",
        "peak_pool_utilization",
        "admission_latency_us",
        "tokens_hashed_per_second",
        "steps",
        "manager_seconds",
        "wall_seconds",
    ],
    "properties": {
        "backend": {"type": "string"},
        "requests": {"type": "integer", "minimum": 0},
        "completed": {"type": "integer", "minimum": 0},
        "rejected": {"type": "integer", "minimum": 0},
        "preemptions": {"type": "integer", "minimum": 0},
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "reused_tokens": {"type": "integer", "minimum": 0},
        "hit_rate": {"type": "number", "minimum": 0, "maximum": 1},
        "evictions": {"type": "integer", "minimum": 0},
        "peak_pool_utilization": {"type": "number", "minimum": 0, "maximum": 1},
        "admission_latency_us": {
            "type": "object",
            "required": ["p50", "p99"],
            "properties": {"p50": {"type": "number", "minimum": 0}, "p99": {"type": "number", "minimum": 0}},
        },
        "tokens_hashed_per_second": {"type": "number", "minimum": 0},
        "steps": {"type": "integer", "minimum": 0},
        "manager_seconds": {"type": "number", "minimum": 0},
        "wall_seconds": {"type": "number", "minimum": 0},
    },
    "additionalProperties": False,
}
COMPARE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["backends", "reuse_identical", "speed_ratio"],
    "properties": {
        "backends": {"type": "array", "items": SUMMARY_SCHEMA, "minItems": 1},
        "reuse_identical": {"type": "boolean"},
        "speed_ratio": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
    },
    "additionalProperties": False,
}


def percentile(values: list[float], q: int) -> float:
    """The nearest-rank ``q``-th percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-q * len(ordered) // 100))  # ceil(q / 100 * n)
    return ordered[rank - 1]


def summary(result: ReplayResult) -> dict[str, Any]:
    records = result.records
    prompt = sum(r.prompt_tokens for r in records)
    reused = sum(r.reused_tokens for r in records)
    latencies = [r.admission_seconds * 1e6 for r in records if r.admission_seconds is not None]
    return {
        "backend": result.backend,
        "requests": len(records),
        "completed": sum(not r.rejected for r in records),
        "rejected": sum(r.rejected for r in records),
        "preemptions": sum(r.preemptions for r in records),
        "prompt_tokens": prompt,
        "reused_tokens": reused,
        "hit_rate": reused / prompt if prompt else 0.0,
        "evictions": result.evicted_pages,
        "peak_pool_utilization": max((s.utilization for s in result.samples), default=0.0),
        "admission_latency_us": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)},
        "tokens_hashed_per_second": result.hashed_tokens / result.hashing_seconds if result.hashing_seconds else 0.0,
        "steps": result.steps,
        "manager_seconds": result.manager_seconds,
        "wall_seconds": result.wall_seconds,
    }


ROWS = [
    ("requests", "requests", "{:,}"),
    ("completed", "completed", "{:,}"),
    ("rejected", "rejected (too large)", "{:,}"),
    ("preemptions", "preemptions", "{:,}"),
    ("prompt_tokens", "prompt tokens", "{:,}"),
    ("reused_tokens", "reused tokens", "{:,}"),
    ("hit_rate", "hit rate", "{:.2%}"),
    ("evictions", "evictions (pages)", "{:,}"),
    ("peak_pool_utilization", "peak pool utilisation", "{:.1%}"),
    ("admission_p50", "admission latency p50", "{:,.1f} us"),
    ("admission_p99", "admission latency p99", "{:,.1f} us"),
    ("tokens_hashed_per_second", "tokens hashed per second", "{:,.0f}"),
    ("steps", "engine steps", "{:,}"),
    ("manager_seconds", "time in the manager", "{:.3f} s"),
    ("wall_seconds", "wall time", "{:.3f} s"),
]


def _cells(s: dict[str, Any]) -> dict[str, Any]:
    flat = dict(s)
    flat["admission_p50"] = s["admission_latency_us"]["p50"]
    flat["admission_p99"] = s["admission_latency_us"]["p99"]
    return flat


def table(summaries: list[dict[str, Any]]) -> str:
    """A text table, one column per backend."""
    cells = [_cells(s) for s in summaries]
    header = ["", *(s["backend"] for s in summaries)]
    lines = [[label, *(fmt.format(c[key]) for c in cells)] for key, label, fmt in ROWS]
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    out.append("  ".join("-" * w for w in widths))
    for row in lines:
        out.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    return "\n".join(out)


def comparison(results: list[ReplayResult]) -> dict[str, Any]:
    """Summaries side by side; reuse must agree to the token, request by request."""
    summaries = [summary(r) for r in results]
    reuse = [[rec.reused_tokens for rec in r.records] for r in results]
    base = min(s["manager_seconds"] for s in summaries)
    return {
        "backends": summaries,
        "reuse_identical": all(x == reuse[0] for x in reuse[1:]) and len({s["evictions"] for s in summaries}) == 1,
        # Time in the manager relative to the fastest backend (1.0 for the fastest).
        "speed_ratio": {s["backend"]: (s["manager_seconds"] / base if base else 0.0) for s in summaries},
    }
