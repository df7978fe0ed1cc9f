"""Why a replay's prompts missed (issue 28; docs/replay.md, "Why prompts missed"): each admitted
request's reuse report (``KVCache.reuse_report``) summed by reason, and a one-line hint where one
reason holds most of the missed tokens."""

from __future__ import annotations

from collections import Counter
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from kv_api.stats import ReuseReport
from kv_replay.plural import plural

if TYPE_CHECKING:
    from kv_replay.replay_result import ReplayResult

#: The manager's reasons, in the report's order (``ReuseReport.miss_<reason>_tokens``).
REASONS = ("stale", "capped", "evicted", "partial", "never_seen", "other_scope")
#: With the replay's own: the prompts of requests too large to admit.
REPLAY_REASONS = (*REASONS, "rejected")
#: A reason holding at least this share of the missed tokens gets a hint.
DOMINANT = 0.6
_Age = TypeVar("_Age", int, float)

MISSES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["tokens", "hint"],
    "properties": {
        "tokens": {
            "type": "object",
            "required": list(REPLAY_REASONS),
            "properties": {reason: {"type": "integer", "minimum": 0} for reason in REPLAY_REASONS},
            "additionalProperties": False,
        },
        "hint": {"type": ["string", "null"]},
    },
    "additionalProperties": False,
}
ROWS = [(f"miss_{reason}", f"missed: {reason.replace('_', ' ')}", "{:,}") for reason in REPLAY_REASONS]


_MISSES = attrgetter(*(f"miss_{reason}_tokens" for reason in REASONS))


def misses_of(report: ReuseReport) -> tuple[int, ...]:
    """The report's missed tokens per reason, in ``REASONS``' order."""
    misses: tuple[int, ...] = _MISSES(report)
    return misses


def miss_summary(result: ReplayResult) -> dict[str, Any]:
    """Missed tokens per reason (with the reused ones, the prompts' tokens), and the hint."""
    tokens = {reason: sum(r.misses[i] for r in result.records if r.misses) for i, reason in enumerate(REASONS)}
    tokens["rejected"] = sum(r.prompt_tokens for r in result.records if r.rejected)
    return {"tokens": tokens, "hint": hint(tokens, result)}


def _median(ages: Counter[_Age]) -> _Age | None:
    """The age half the evicted blocks are younger than (or as old as); None without any."""
    half, seen = sum(ages.values()) / 2, 0
    for age in sorted(ages):
        seen += ages[age]
        if seen >= half:
            return age
    return None


def hint(tokens: dict[str, int], result: ReplayResult) -> str | None:
    """What to change, where one reason holds ``DOMINANT`` of the missed tokens or more."""
    missed = sum(tokens.values())
    if not missed:
        return None
    reason = max(REPLAY_REASONS, key=lambda r: tokens[r])
    share = tokens[reason] / missed
    if share < DOMINANT:
        return None
    lead = f"{share:.0%} of missed tokens"
    if reason == "evicted":
        # An age counts the requests admitted between the eviction and the one asking again:
        # the eviction came with the request that many plus one before it.
        age, seconds = (_median(result.evicted_ages) or 0) + 1, _median(result.evicted_seconds)
        clock = "" if seconds is None else f" ({seconds:,.1f} s of the trace's time)"
        return (
            f"{lead} were evicted, half of them within {plural(age, 'request')}{clock}: "
            "a larger --quota or --host-quota would keep them"
        )
    return (
        lead
        + {
            "stale": " were cut back (a window page or SSM snapshot gone): pages of those layers ran out first",
            "capped": " were cut by the reuse backoff or max_reused_tokens",
            "partial": " lay below a block boundary: fewer tokens per block would keep more of them",
            "never_seen": " were seen for the first time: no cache size reuses those",
            "other_scope": " are cached under another salt or LoRA adapter: requests that may share should share a scope",
            "rejected": " belong to prompts too large for the device quota: a larger --quota admits them",
        }[reason]
    )


def miss_cells(s: dict[str, Any]) -> dict[str, Any]:
    return {f"miss_{reason}": n for reason, n in s["misses"]["tokens"].items()}


def hint_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """The hints under a table: one line, or one per backend that has one when they differ."""
    hints = [(s["backend"], s["misses"]["hint"]) for s in summaries if s["misses"]["hint"]]
    if len({h for _, h in hints}) == 1 and len(hints) == len(summaries):
        return [f"hint: {hints[0][1]}"]
    return [f"hint ({backend}): {h}" for backend, h in hints]
