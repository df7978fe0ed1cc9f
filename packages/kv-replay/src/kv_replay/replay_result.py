"""What a replay records: per request (``RequestRecord``), per engine step (``Sample``) and in
all (``ReplayResult``), as ``kv_replay.replayer`` fills them and the reports read them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kv_api import CacheTierConfig


@dataclass
class RequestRecord:
    prompt_tokens: int
    output_tokens: int
    reused_tokens: int = 0  # when it first started
    preemptions: int = 0
    rejected: bool = False
    admission_seconds: float | None = None  # from create_kv_cache until it first started
    reused_by_level: list[int] = field(default_factory=list)  # its reused tokens by the level found on
    misses: tuple[int, ...] = ()  # its prompt's tokens not reused, per reason (miss_report.REASONS)
    step: int = -1  # the step it first started in, or was rejected in before starting
    name: str = ""  # the request's
    prefix: int | None = None  # a hash of its scope and first block (prefix_report), None if shorter


@dataclass(slots=True)  # one per step: built as cheaply as a dataclass can be
class Sample:
    """The state after one step."""

    step: int
    completed: int
    prompt_tokens: int  # of the requests started or rejected so far
    reused_tokens: int
    utilization: float  # the fullest pool group's share of slots in use by open caches
    occupancy: float  # the same, counting cached (evictable) pages too


@dataclass
class ReplayResult:
    backend: str
    quota: int  # the device quota asked for
    tokens_per_block: int
    records: list[RequestRecord]
    samples: list[Sample] = field(default_factory=list)
    evicted_pages: int = 0
    steps: int = 0
    manager_seconds: float = 0.0  # inside manager and cache calls
    hashed_tokens: int = 0  # given to create_kv_cache and commit
    hashing_seconds: float = 0.0  # inside those calls
    wall_seconds: float = 0.0
    peak_resident_bytes: int = 0  # the process's, from building the manager to the end of the replay
    levels: list[str] = field(default_factory=lambda: ["device"])  # the cache levels, warm to cold
    level_quotas: list[int] = field(default_factory=list)  # asked for, per level
    bytes_moved: dict[tuple[int, int], int] = field(default_factory=dict)  # per (src level, dst level)
    onboarded_pages: int = 0  # moved up to the device level
    # Successful resume() calls of caches that found reused tokens below the device level, and of the others.
    onboarding_resume_seconds: list[float] = field(default_factory=list)
    other_resume_seconds: list[float] = field(default_factory=list)
    level_utilization: list[float] = field(default_factory=list)  # per level at the end (see _occupancy)
    # The remote tier's counters (CacheStats' remote_*), None without one.
    remote: dict[str, int] | None = None
    store: dict[str, Any] | None = None  # the store's own counters (kv_store.StoreStats), where it has them
    # Evicted prompt blocks of admitted requests, per age (caches created since the eviction),
    # and per age in the trace's seconds (from the arrival of the request created then) where
    # the trace gives timestamps.
    evicted_ages: Counter[int] = field(default_factory=Counter)
    evicted_seconds: Counter[float] = field(default_factory=Counter)


#: ``CacheStats``' remote counters, as a report names them.
REMOTE_COUNTERS = {
    "lookups": "remote_lookups",
    "blocks": "remote_blocks",
    "rejected": "remote_rejected",
    "written": "remote_written",
    "errors": "remote_errors",
    "skipped": "remote_skipped",
}


def level_name(tier: CacheTierConfig) -> str:
    """``device``, ``host``, ``disk`` or ``remote``: a cache tier's config as the report names its level."""
    return tier.tier.level_name
