"""What a replay reports: the summary (table or JSON, schema in docs/replay.md) and the
side-by-side comparison of backends."""

from __future__ import annotations

from typing import Any

from kv_api.constants import ceil_div
from kv_replay.replayer import ReplayResult
from kv_replay.sizes import format_size

#: JSON Schema of ``kvcore replay --json`` (one summary) and ``--json --compare`` (several).
SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "backend",
        "quota",
        "tokens_per_block",
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
        "peak_resident_bytes",
    ],
    "properties": {
        "backend": {"type": "string"},
        "quota": {"type": "integer", "minimum": 1},
        "tokens_per_block": {"type": "integer", "minimum": 1},
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
        "peak_resident_bytes": {"type": "integer", "minimum": 0},
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
SWEEP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["rows", "unbounded", "reuse_identical"],
    "properties": {
        "rows": {"type": "array", "items": SUMMARY_SCHEMA, "minItems": 1},
        "unbounded": {"type": "array", "items": SUMMARY_SCHEMA, "minItems": 1},
        "reuse_identical": {"type": "boolean"},
    },
    "additionalProperties": False,
}


def percentile(values: list[float], q: int) -> float:
    """The nearest-rank ``q``-th percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, ceil_div(q * len(ordered), 100))
    return ordered[rank - 1]


def summary(result: ReplayResult) -> dict[str, Any]:
    records = result.records
    prompt = sum(r.prompt_tokens for r in records)
    reused = sum(r.reused_tokens for r in records)
    latencies = [r.admission_seconds * 1e6 for r in records if r.admission_seconds is not None]
    return {
        "backend": result.backend,
        "quota": result.quota,
        "tokens_per_block": result.tokens_per_block,
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
        "peak_resident_bytes": result.peak_resident_bytes,
    }


ROWS = [
    ("quota", "device quota", "{}"),
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
    ("peak_resident_mib", "peak resident memory", "{:,.0f} MiB"),
]


def _cells(s: dict[str, Any]) -> dict[str, Any]:
    flat = dict(s)
    flat["admission_p50"] = s["admission_latency_us"]["p50"]
    flat["admission_p99"] = s["admission_latency_us"]["p99"]
    flat["quota"] = format_size(s["quota"])
    flat["peak_resident_mib"] = s["peak_resident_bytes"] / (1 << 20)
    return flat


def _grid(rows: list[list[str]], left: int) -> list[str]:
    """Aligned text rows, a rule under the header: the first ``left`` columns flush left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = [
        "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def verdict(identical: bool) -> str:
    return "reuse identical on every backend" if identical else "REUSE DIFFERS between backends"


def table(summaries: list[dict[str, Any]]) -> str:
    """A text table, one column per backend."""
    cells = [_cells(s) for s in summaries]
    header = ["", *(s["backend"] for s in summaries)]
    lines = [[label, *(fmt.format(c[key]) for c in cells)] for key, label, fmt in ROWS]
    return "\n".join(_grid([header, *lines], left=1))


def identical(results: list[ReplayResult]) -> bool:
    """Reuse agrees to the token, request by request, and so do evictions."""
    reuse = [[rec.reused_tokens for rec in r.records] for r in results]
    return all(x == reuse[0] for x in reuse[1:]) and len({r.evicted_pages for r in results}) == 1


def comparison(results: list[ReplayResult]) -> dict[str, Any]:
    """Summaries side by side, whether reuse is identical, and the time ratios."""
    summaries = [summary(r) for r in results]
    base = min(s["manager_seconds"] for s in summaries)
    return {
        "backends": summaries,
        "reuse_identical": identical(results),
        # Time in the manager relative to the fastest backend (1.0 for the fastest).
        "speed_ratio": {s["backend"]: (s["manager_seconds"] / base if base else 0.0) for s in summaries},
    }


def sweep(rows: list[ReplayResult], unbounded: list[ReplayResult]) -> dict[str, Any]:
    """A capacity sweep: one summary per (quota, backend), the unbounded reference per backend,
    and whether every backend replayed every quota identically."""
    by_quota: dict[int, list[ReplayResult]] = {}
    for r in rows:
        by_quota.setdefault(r.quota, []).append(r)
    return {
        "rows": [summary(r) for r in rows],
        "unbounded": [summary(r) for r in unbounded],
        "reuse_identical": all(identical(group) for group in [*by_quota.values(), unbounded]),
    }


SWEEP_COLUMNS = [
    ("quota", "quota", "{}"),
    ("backend", "backend", "{}"),
    ("hit_rate", "hit rate", "{:.2%}"),
    ("evictions", "evictions", "{:,}"),
    ("preemptions", "preemptions", "{:,}"),
    ("rejected", "rejected", "{:,}"),
    ("peak_pool_utilization", "peak utilisation", "{:.1%}"),
    ("manager_seconds", "time in manager", "{:.3f} s"),
]


def sweep_table(report: dict[str, Any]) -> str:
    """One row per (quota, backend), the unbounded reference last."""
    cells = [_cells(s) for s in report["rows"]]
    for s in report["unbounded"]:
        cells.append({**_cells(s), "quota": "unbounded"})
    lines = [[label for _, label, _ in SWEEP_COLUMNS]]
    lines += [[fmt.format(c[key]) for key, _, fmt in SWEEP_COLUMNS] for c in cells]
    out = _grid(lines, left=2)
    if len(report["unbounded"]) > 1:
        out += ["", verdict(report["reuse_identical"])]
    return "\n".join(out)
