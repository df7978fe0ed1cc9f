"""The shared prefixes a replay missed most (issue 28; docs/replay.md, "Why prompts missed").

Requests whose prompts start with the same block (the same scope and first ``tokens_per_block``
tokens) share a prefix: a system prompt, a document, a conversation. A prefix whose requests
missed tokens that the cache once held (evicted) is one a larger cache, or a higher priority for
it, would have kept; the report lists the ``TOP`` such prefixes by evicted tokens, each named by
the first request that used it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kv_replay.grid import grid
from kv_replay.miss_report import REASONS

if TYPE_CHECKING:
    from kv_replay.replay_result import ReplayResult
    from kv_replay.trace import Request

TOP = 10
_EVICTED = REASONS.index("evicted")

PREFIXES_SCHEMA: dict[str, Any] = {
    "type": "array",
    "maxItems": TOP,
    "items": {
        "type": "object",
        "required": ["first_request", "requests", "prompt_tokens", "reused_tokens", "evicted_tokens"],
        "properties": {
            "first_request": {"type": "string"},
            **{
                key: {"type": "integer", "minimum": 0}
                for key in ("requests", "prompt_tokens", "reused_tokens", "evicted_tokens")
            },
        },
        "additionalProperties": False,
    },
}


def first_block(request: Request, tokens_per_block: int) -> int | None:
    """What names a request's prefix: a hash of its scope and first block's tokens (None when
    the prompt is shorter than a block: it shares no whole block)."""
    if request.prompt_length < tokens_per_block:
        return None
    return hash((request.scope, request.prompt_head(tokens_per_block).tobytes()))


@dataclass
class _Prefix:
    first_request: str
    requests: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    evicted_tokens: int = 0


def prefix_summary(result: ReplayResult) -> list[dict[str, Any]]:
    """The ``TOP`` prefixes shared by two requests or more with the most evicted tokens."""
    groups: dict[int, _Prefix] = {}
    for record in result.records:
        if record.prefix is None:
            continue
        group = groups.setdefault(record.prefix, _Prefix(record.name))
        group.requests += 1
        group.prompt_tokens += record.prompt_tokens
        group.reused_tokens += record.reused_tokens
        group.evicted_tokens += record.misses[_EVICTED] if record.misses else 0
    shared = [g for g in groups.values() if g.requests > 1 and g.evicted_tokens]
    shared.sort(key=lambda g: -g.evicted_tokens)  # stable: ties in the order first seen
    return [vars(g) for g in shared[:TOP]]


def prefix_lines(prefixes: list[dict[str, Any]]) -> list[str]:
    """The table under the report: one line per prefix, or nothing."""
    if not prefixes:
        return []
    rows = [("most-missed shared prefixes", "requests", "hit rate", "evicted tokens")]
    for p in prefixes:
        rate = p["reused_tokens"] / p["prompt_tokens"] if p["prompt_tokens"] else 0.0
        rows.append((f"as in {p['first_request']}", f"{p['requests']:,}", f"{rate:.1%}", f"{p['evicted_tokens']:,}"))
    return ["", *grid(rows, left=1)]
