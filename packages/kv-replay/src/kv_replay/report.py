"""What a replay reports: the summary (table or JSON, schema in docs/replay.md) and the
side-by-side comparison of backends."""

from __future__ import annotations

from typing import Any

from kv_api.constants import ceil_div
from kv_replay.grid import grid
from kv_replay.header import Setup
from kv_replay.miss_report import MISSES_SCHEMA, hint_lines, miss_cells, miss_summary
from kv_replay.miss_report import ROWS as MISS_ROWS
from kv_replay.prefix_report import PREFIXES_SCHEMA, prefix_lines, prefix_summary
from kv_replay.remote_report import REMOTE_ROWS, REMOTE_SCHEMA, remote_cells, remote_summary
from kv_replay.replay_result import ReplayResult
from kv_replay.sizes import format_size, human_size

_LATENCY = {
    "type": "object",
    "required": ["count", "mean", "p50", "p99"],
    "properties": {
        "count": {"type": "integer", "minimum": 0},
        "mean": {"type": "number", "minimum": 0},
        "p50": {"type": "number", "minimum": 0},
        "p99": {"type": "number", "minimum": 0},
    },
    "additionalProperties": False,
}
_LEVELS = ["device", "host", "disk", "remote"]

#: JSON Schema of ``kvcore replay --json`` (one summary) and ``--json --compare`` (several).
SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "trace",
        "backend",
        "layers",
        "num_layers",
        "tokens_per_block",
        "bytes_per_token",
        "quota",
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
        "host_quota",
        "disk_quota",
        "reused_tokens_by_level",
        "bytes_moved",
        "onboarded_pages",
        "resume_latency_us",
        "level_utilization",
        "remote",
        "misses",
        "prefixes",
    ],
    "properties": {
        "trace": {"type": "string"},
        "backend": {"type": "string"},
        "layers": {"type": "string"},
        "num_layers": {"type": "integer", "minimum": 1},
        "tokens_per_block": {"type": "integer", "minimum": 1},
        "bytes_per_token": {"type": "integer", "minimum": 1},
        "quota": {"type": "integer", "minimum": 1},
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
        "host_quota": {"type": ["integer", "null"], "minimum": 1},
        "disk_quota": {"type": ["integer", "null"], "minimum": 1},
        "reused_tokens_by_level": {
            "type": "object",
            "required": ["device"],
            "properties": {level: {"type": "integer", "minimum": 0} for level in _LEVELS},
            "additionalProperties": False,
        },
        "bytes_moved": {
            "type": "object",
            "propertyNames": {"pattern": "^(device|host|disk|remote)->(device|host|disk|remote)$"},
            "additionalProperties": {"type": "integer", "minimum": 0},
        },
        "onboarded_pages": {"type": "integer", "minimum": 0},
        "resume_latency_us": {
            "type": "object",
            "required": ["onboarding", "other"],
            "properties": {"onboarding": _LATENCY, "other": _LATENCY},
            "additionalProperties": False,
        },
        "level_utilization": {
            "type": "object",
            "required": ["device"],
            "properties": {level: {"type": "number", "minimum": 0, "maximum": 1} for level in _LEVELS[:3]},
            "additionalProperties": False,
        },
        "remote": REMOTE_SCHEMA,
        "misses": MISSES_SCHEMA,
        "prefixes": PREFIXES_SCHEMA,
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


def latency_us(seconds: list[float]) -> dict[str, Any]:
    """Count, mean and nearest-rank p50/p99 of durations, in microseconds (0 for none)."""
    values = [x * 1e6 for x in seconds]
    return {
        "count": len(values),
        "mean": sum(values) / len(values) if values else 0.0,
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
    }


def _tier_quota(result: ReplayResult, level: str) -> int | None:
    return result.level_quotas[result.levels.index(level)] if level in result.levels else None


def summary(result: ReplayResult, setup: Setup | None = None) -> dict[str, Any]:
    """The numbers of one replay; with ``setup`` (as the command prints it, and the schema asks)
    also what was replayed: the trace and the model's layout."""
    records = result.records
    prompt = sum(r.prompt_tokens for r in records)
    reused = sum(r.reused_tokens for r in records)
    latencies = [r.admission_seconds * 1e6 for r in records if r.admission_seconds is not None]
    named: dict[str, Any] = {"backend": result.backend, "tokens_per_block": result.tokens_per_block}
    if setup is not None:
        named = {"trace": setup.trace, "backend": result.backend, **setup.layout_fields()}
    return {
        **named,
        "quota": result.quota,
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
        "host_quota": _tier_quota(result, "host"),
        "disk_quota": _tier_quota(result, "disk"),
        # Where each request's reused tokens were found when it first started.
        "reused_tokens_by_level": {
            level: sum(r.reused_by_level[i] for r in records if i < len(r.reused_by_level))
            for i, level in enumerate(result.levels)
        },
        "bytes_moved": {
            f"{result.levels[src]}->{result.levels[dst]}": n for (src, dst), n in sorted(result.bytes_moved.items())
        },
        "onboarded_pages": result.onboarded_pages,
        "resume_latency_us": {
            "onboarding": latency_us(result.onboarding_resume_seconds),
            "other": latency_us(result.other_resume_seconds),
        },
        "level_utilization": dict(zip(result.levels, result.level_utilization, strict=False)),
        "remote": remote_summary(result),
        "misses": miss_summary(result),
        "prefixes": prefix_summary(result),
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


def _tiered(summaries: list[dict[str, Any]]) -> bool:
    return any(len(s["reused_tokens_by_level"]) > 1 for s in summaries)


def _tier_rows(summaries: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The rows a replay with host or disk tiers adds, for every level and direction any of
    ``summaries`` has."""
    levels = [level for level in _LEVELS if any(level in s["reused_tokens_by_level"] for s in summaries)]
    directions = sorted(
        {d for s in summaries for d in s["bytes_moved"]},
        key=lambda d: tuple(_LEVELS.index(x) for x in d.split("->")),
    )
    rows = [("host_quota", "host quota", "{}"), ("disk_quota", "disk quota", "{}")]
    rows += [(f"reused_{level}", f"reused tokens found on {level}", "{:,}") for level in levels]
    rows += [(f"moved_{d}", f"moved {d.replace('->', '→')}", "{}") for d in directions]
    rows.append(("onboarded_pages", "onboarded pages", "{:,}"))
    for kind, label in (("onboarding", "onboarding resume"), ("other", "other resume")):
        rows.append((f"{kind}_count", f"{label}s", "{:,}"))
        rows += [(f"{kind}_{q}", f"{label} {q}", "{:,.1f} us") for q in ("p50", "p99", "mean")]
    rows += [(f"utilization_{level}", f"{level} utilisation at end", "{:.1%}") for level in levels if level != "remote"]
    return rows


def _cells(s: dict[str, Any]) -> dict[str, Any]:
    flat = dict(s)
    for level in ("host", "disk"):
        quota = s[f"{level}_quota"]
        flat[f"{level}_quota"] = format_size(quota) if quota is not None else "none"
    for level in _LEVELS:
        flat[f"reused_{level}"] = s["reused_tokens_by_level"].get(level, 0)
        flat[f"utilization_{level}"] = s["level_utilization"].get(level, 0.0)
    flat["reused_below"] = sum(n for level, n in s["reused_tokens_by_level"].items() if level != "device")
    # Every direction between levels, device->device too (a reused partial block copied into
    # a cache's own page): another summary of the table may have moved bytes where this did not.
    for direction in ("->".join((a, b)) for a in _LEVELS for b in _LEVELS):
        flat[f"moved_{direction}"] = human_size(s["bytes_moved"].get(direction, 0))
    for kind, stats in s["resume_latency_us"].items():
        for key, value in stats.items():
            flat[f"{kind}_{key}"] = value
    flat["admission_p50"] = s["admission_latency_us"]["p50"]
    flat["admission_p99"] = s["admission_latency_us"]["p99"]
    flat["quota"] = format_size(s["quota"])
    flat["peak_resident_mib"] = s["peak_resident_bytes"] / (1 << 20)
    return flat | remote_cells(s) | miss_cells(s)


def verdict(identical: bool) -> str:
    return "reuse identical on every backend" if identical else "REUSE DIFFERS between backends"


def table(summaries: list[dict[str, Any]]) -> str:
    """A text table, one column per backend."""
    cells = [_cells(s) for s in summaries]
    header = ["", *(s["backend"] for s in summaries)]
    rows = ROWS
    if _tiered(summaries):  # after the evictions row
        at = [key for key, _, _ in ROWS].index("evictions") + 1
        rows = [*ROWS[:at], *_tier_rows(summaries), *ROWS[at:]]
    if any(s["remote"] for s in summaries):
        rows = [*rows, *REMOTE_ROWS]
    rows = [*rows, *MISS_ROWS]
    lines = [[label, *(fmt.format(c[key]) for c in cells)] for key, label, fmt in rows]
    prefixes = prefix_lines(summaries[0]["prefixes"]) if summaries else []
    return "\n".join([*grid([header, *lines], left=1), *hint_lines(summaries), *prefixes])


def identical(results: list[ReplayResult]) -> bool:
    """Reuse agrees to the token, request by request (and by the level it was found on), and so
    do evictions, onboarded pages and the bytes moved per direction."""
    reuse = [[(rec.reused_tokens, rec.reused_by_level) for rec in r.records] for r in results]
    moves = {(r.evicted_pages, r.onboarded_pages, tuple(sorted(r.bytes_moved.items()))) for r in results}
    return all(x == reuse[0] for x in reuse[1:]) and len(moves) == 1


def comparison(results: list[ReplayResult], setup: Setup | None = None) -> dict[str, Any]:
    """Summaries side by side, whether reuse is identical, and the time ratios."""
    summaries = [summary(r, setup) for r in results]
    base = min(s["manager_seconds"] for s in summaries)
    return {
        "backends": summaries,
        "reuse_identical": identical(results),
        # Time in the manager relative to the fastest backend (1.0 for the fastest).
        "speed_ratio": {s["backend"]: (s["manager_seconds"] / base if base else 0.0) for s in summaries},
    }


def sweep(rows: list[ReplayResult], unbounded: list[ReplayResult], setup: Setup | None = None) -> dict[str, Any]:
    """A capacity sweep: one summary per (quotas, backend), the unbounded reference per backend,
    and whether every backend replayed every quota identically."""
    by_quota: dict[tuple[int, ...], list[ReplayResult]] = {}
    for r in rows:
        by_quota.setdefault(tuple(r.level_quotas) or (r.quota,), []).append(r)
    return {
        "rows": [summary(r, setup) for r in rows],
        "unbounded": [summary(r, setup) for r in unbounded],
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
SWEEP_TIER_QUOTAS = [("host_quota", "host quota", "{}")]
SWEEP_DISK_QUOTAS = [("disk_quota", "disk quota", "{}")]
SWEEP_TIER_COLUMNS = [
    ("reused_below", "reused from below device", "{:,}"),
    ("onboarded_pages", "onboarded", "{:,}"),
]


def sweep_table(report: dict[str, Any]) -> str:
    """One row per (quotas, backend), the unbounded reference last; with host or disk tiers,
    their quotas (the unbounded replay has none), reuse found below the device and onboarding."""
    columns = SWEEP_COLUMNS
    if _tiered(report["rows"]):
        columns = [
            columns[0],
            *(SWEEP_TIER_QUOTAS if any(s["host_quota"] for s in report["rows"]) else []),
            *(SWEEP_DISK_QUOTAS if any(s["disk_quota"] for s in report["rows"]) else []),
            *columns[1:3],
            *SWEEP_TIER_COLUMNS,
            *columns[3:],
        ]
    cells = [_cells(s) for s in report["rows"]]
    for s in report["unbounded"]:
        cells.append({**_cells(s), "quota": "unbounded", "host_quota": "-", "disk_quota": "-"})
    lines = [[label for _, label, _ in columns]]
    lines += [[fmt.format(c[key]) for key, _, fmt in columns] for c in cells]
    out = grid(lines, left=[key for key, _, _ in columns].index("backend") + 1)
    if len(report["unbounded"]) > 1:
        out += ["", verdict(report["reuse_identical"])]
    return "\n".join(out)
