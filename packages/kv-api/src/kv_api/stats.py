"""Statistics a manager reports."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CacheStats",
    "DecodeSteps",
    "EvictedBlock",
    "KVCacheStatsDelta",
    "LifeCycleStats",
    "ReuseMatch",
    "ReuseReport",
    "SsmSnapshotStats",
    "StorageStatistics",
]


@dataclass(frozen=True)
class StorageStatistics:
    """Slot accounting of one pool group at one cache level, in slots.

    ``available = free + evictable`` and ``unavailable = total - available``.
    """

    total: int
    free: int
    evictable: int

    @property
    def available(self) -> int:
        return self.free + self.evictable

    @property
    def unavailable(self) -> int:
        return self.total - self.available


@dataclass(frozen=True)
class DecodeSteps:
    """What ``KVCacheManager.decode_steps`` did: ``steps`` iterations ran in full. Where it
    stopped before the last, ``resized`` holds the stopped iteration's resize results (one per
    cache, at least one False; empty when every iteration ran). After each iteration that ran,
    ``free[k][g]`` and ``evictable[k][g]``: pool group ``g``'s free and evictable slots at the
    device level, as ``get_storage_statistics()`` reads them then."""

    steps: int
    resized: list[bool]
    free: list[list[int]]
    evictable: list[list[int]]


@dataclass(frozen=True)
class CacheStats:
    """Counters of a manager, since construction (committed) or since the last reset (iteration).

    - ``requests``: caches created; ``lookup_tokens``: tokens they asked to reuse;
      ``reused_tokens``: tokens reused from the tree.
    - ``allocated_pages``: pages handed out; ``evicted_pages``: pages evicted from the device
      level to make room (moved to a colder level or dropped); ``onboarded_pages``: pages moved
      up to the device level (``resume``, ``prefetch``).
    - ``committed_blocks``: blocks that entered the tree.
    - ``corrupt_pages``: pages read back from disk whose bytes failed their checksum (taken out
      of the tree, never served); ``disk_full_events``: times a disk tier's file system had no
      room for the pages falling there (the tier shrank to the slots it has: its storage
      statistics say how many).
    - The remote tier (``RemoteCacheTierConfig``): ``remote_lookups``, matches that asked the
      store; ``remote_blocks``, blocks it returned that entered the tree (their tokens count
      in ``reused_tokens`` when a cache reuses them); ``remote_rejected``, values that failed
      their checks (never used); ``remote_written``, committed blocks handed to the store;
      ``remote_errors``, store calls that raised or answered out of range (each a miss or a
      write not made, never an error of the manager's call); ``remote_skipped``, committed
      blocks not handed over (nor encoded) while the store asked for a pause (``put``'s answer:
      it is down or closed).
    - Why prompt tokens were not reused (``KVCache.reuse_report``'s parts, summed over the
      caches created; zero with ``reuse_report=False``): ``miss_stale_tokens``,
      ``miss_capped_tokens``, ``miss_evicted_tokens``, ``miss_partial_tokens``,
      ``miss_never_seen_tokens``, ``miss_other_scope_tokens``. With ``reused_tokens`` they add
      up to ``lookup_tokens``.
    """

    requests: int = 0
    lookup_tokens: int = 0
    reused_tokens: int = 0
    allocated_pages: int = 0
    evicted_pages: int = 0
    committed_blocks: int = 0
    onboarded_pages: int = 0
    corrupt_pages: int = 0
    disk_full_events: int = 0
    remote_lookups: int = 0
    remote_blocks: int = 0
    remote_rejected: int = 0
    remote_written: int = 0
    remote_errors: int = 0
    remote_skipped: int = 0
    miss_stale_tokens: int = 0
    miss_capped_tokens: int = 0
    miss_evicted_tokens: int = 0
    miss_partial_tokens: int = 0
    miss_never_seen_tokens: int = 0
    miss_other_scope_tokens: int = 0


@dataclass(frozen=True)
class KVCacheStatsDelta:
    """What one KV cache created with ``enable_request_stats=True`` accumulated since its last
    ``commit_pending_stats()`` / ``discard_pending_stats()`` (or its creation).

    - ``lookup_tokens`` / ``reused_tokens``: its prompt's tokens and those reused from the tree
      (counted when the cache is created).
    - ``allocated_pages``: pages handed to it (block pages, SSM states, private copies of reused
      partial blocks); ``generation_allocated_pages``: those of blocks starting at or after its
      ``expected_prompt_length`` (pages for generated tokens).
    - ``committed_blocks``: blocks it added to the tree.
    """

    lookup_tokens: int = 0
    reused_tokens: int = 0
    allocated_pages: int = 0
    generation_allocated_pages: int = 0
    committed_blocks: int = 0


@dataclass(frozen=True)
class LifeCycleStats:
    """Counters of one life cycle (= layer group) since the last reset: ``allocated_pages``
    handed to caches, ``committed_pages`` that entered the tree (block pages, partial-tail pages
    and SSM snapshots)."""

    allocated_pages: int = 0
    committed_pages: int = 0


@dataclass(frozen=True)
class SsmSnapshotStats:
    """SSM snapshots since the last reset: ``stored`` (states that entered the tree), ``skipped``
    (states a commit could not copy for lack of device room) and ``reused`` (caches created on a
    matched snapshot)."""

    stored: int = 0
    skipped: int = 0
    reused: int = 0


@dataclass(frozen=True)
class ReuseMatch:
    """How a reuse match got its length (``KVCacheManager.probe_reuse_match``), in tokens:
    ``num_reused_tokens <= num_attention_tokens <= num_divergence_tokens <= num_lookup_tokens``.

    - ``num_lookup_tokens``: the tokens looked up (the prompt);
    - ``num_divergence_tokens``: how deep the walk of the tree went before the prompt diverged
      from it (before backoff and pruning);
    - ``num_attention_tokens``: the match after backoff and attention-coverage pruning only (what
      a model without SSM layers would reuse; the length before hybrid pruning);
    - ``num_reused_tokens``: the match (``probe_reuse``).
    """

    num_lookup_tokens: int
    num_divergence_tokens: int
    num_attention_tokens: int
    num_reused_tokens: int


@dataclass(frozen=True)
class EvictedBlock:
    """A prompt block the tree held once (the ghost record's entry): the cache ``level`` it was
    dropped from, and its ``age``, in caches created since (0: dropped after the last one)."""

    level: int
    age: int


@dataclass(frozen=True)
class ReuseReport:
    """Why each token of a prompt was or was not reused when its cache was created
    (``KVCache.reuse_report``; docs/manager.md, "Why a prompt missed"). The parts add up to
    ``num_prompt_tokens``:

    - ``reused_tokens_by_level``: reused, per cache level where each block was found
      (``KVCache.cached_tokens_by_level``);
    - ``miss_stale_tokens``: the tree holds them, but pruning cut the match back (a window page
      or an SSM snapshot it needs is gone);
    - ``miss_capped_tokens``: matched, cut by ``reuse_match_backoff`` or ``max_reused_tokens``;
    - ``miss_evicted_tokens``: blocks the tree held once (the ghost record knows them;
      ``evicted_blocks``, in prompt order, says from which level and how long ago);
    - ``miss_partial_tokens``: the prompt's tail shorter than a block, and the tokens a cached
      block shares with the first missed one below the block boundary (partial reuse off);
    - ``miss_other_scope_tokens``: never cached in this scope, but cached under another salt or
      LoRA id (only with ``reuse_report_other_scope=True``);
    - ``miss_never_seen_tokens``: the rest.
    """

    num_prompt_tokens: int
    reused_tokens_by_level: tuple[int, ...]
    miss_stale_tokens: int
    miss_capped_tokens: int
    miss_evicted_tokens: int
    miss_partial_tokens: int
    miss_never_seen_tokens: int
    miss_other_scope_tokens: int
    evicted_blocks: tuple[EvictedBlock, ...]
