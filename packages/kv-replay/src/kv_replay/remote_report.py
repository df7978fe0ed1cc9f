"""What a replay with a remote tier (``--remote``) adds to its report: the manager's remote
counters, the page bytes each way, and the store's own counters and call latency."""

from __future__ import annotations

from typing import Any

from kv_replay.replay_result import REMOTE_COUNTERS, ReplayResult
from kv_replay.sizes import human_size

__all__ = ["REMOTE_ROWS", "REMOTE_SCHEMA", "remote_cells", "remote_summary"]

_COUNT = {"type": "integer", "minimum": 0}
_FIELDS = [*REMOTE_COUNTERS, "bytes_in", "bytes_out", "store_errors", "store_dropped", "store_call_us"]
#: ``"remote"`` of a summary: null without a remote tier.
REMOTE_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "required": _FIELDS,
    "properties": {
        **{name: _COUNT for name in _FIELDS if name != "store_call_us"},
        "store_call_us": {"type": "number", "minimum": 0},
    },
    "additionalProperties": False,
}
REMOTE_ROWS = [
    ("remote_lookups", "store lookups", "{:,}"),
    ("remote_blocks", "blocks from the store", "{:,}"),
    ("remote_rejected", "store values refused", "{:,}"),
    ("remote_written", "blocks handed to the store", "{:,}"),
    ("remote_skipped", "blocks not handed over (store paused)", "{:,}"),
    ("remote_bytes_in", "bytes from the store", "{}"),
    ("remote_bytes_out", "bytes handed to the store", "{}"),
    ("remote_errors", "store errors (misses)", "{:,}"),
    ("remote_store_dropped", "writes the store dropped", "{:,}"),
    ("remote_store_call_us", "store call latency (mean)", "{:,.1f} us"),
]


def remote_summary(result: ReplayResult) -> dict[str, Any] | None:
    """The remote tier's part of a summary, None without one. Bytes are page bytes moved to and
    from the store's level; errors are the manager's (calls that raised) plus the store's own."""
    if result.remote is None:
        return None
    level = result.levels.index("remote")
    store = result.store or {}
    calls = store.get("calls", 0)
    return {
        **result.remote,
        "bytes_in": sum(n for (src, _), n in result.bytes_moved.items() if src == level),
        "bytes_out": sum(n for (_, dst), n in result.bytes_moved.items() if dst == level),
        "store_errors": store.get("errors", 0),
        "store_dropped": store.get("dropped", 0),
        "store_call_us": store.get("call_seconds", 0.0) / calls * 1e6 if calls else 0.0,
    }


def remote_cells(s: dict[str, Any]) -> dict[str, Any]:
    """A summary's remote part as table cells (zeros where a summary has none)."""
    remote = s.get("remote") or {}
    cells = {f"remote_{name}": remote.get(name, 0) for name in _FIELDS}
    cells["remote_errors"] = remote.get("errors", 0) + remote.get("store_errors", 0)
    cells["remote_bytes_in"] = human_size(remote.get("bytes_in", 0))
    cells["remote_bytes_out"] = human_size(remote.get("bytes_out", 0))
    return cells
