"""Statistics beyond the manager's ``CacheStats`` (docs/manager.md, "Statistics"): excluded and
dirty cache ids, per-layer-group and SSM-snapshot iteration counters (``StatsBook``, one per
manager) and each cache's pending per-request stats (``RequestStats``, one per cache)."""

from __future__ import annotations

from kv_api.errors import LogicError
from kv_api.keys import Token
from kv_api.stats import KVCacheStatsDelta, LifeCycleStats, SsmSnapshotStats
from kv_core_py.cache_context import CacheContext
from kv_core_py.reuse_report import Misses


class StatsBook:
    """The manager's side: which ids are excluded or dirty, and the counters the caches feed."""

    def __init__(self, context: CacheContext) -> None:
        self.context = context
        ssm = context.registry.ssm_layer_groups
        self.is_ssm = [group in ssm for group in range(len(context.registry.life_cycles))]
        # Ids stay excluded for the manager's life: the ids it hands out never repeat.
        self.excluded: set[int] = set()
        self.dirty: set[int] = set()
        self.allocated = [0] * len(self.is_ssm)  # per layer group
        self.committed = [0] * len(self.is_ssm)
        self.ssm_stored = 0
        self.ssm_skipped = 0
        self.ssm_reused = 0

    def take_life_cycle_stats(self) -> dict[int, LifeCycleStats]:
        out = {
            group: LifeCycleStats(a, c) for group, (a, c) in enumerate(zip(self.allocated, self.committed, strict=True))
        }
        self.allocated = [0] * len(self.is_ssm)
        self.committed = [0] * len(self.is_ssm)
        return out

    def take_ssm_stats(self) -> SsmSnapshotStats:
        out = SsmSnapshotStats(self.ssm_stored, self.ssm_skipped, self.ssm_reused)
        self.ssm_stored = self.ssm_skipped = self.ssm_reused = 0
        return out


def first_digest(tokens: list[Token]) -> int | None:
    """The position of the first digest token, None without one (a text-only cache refuses them)."""
    return next((i for i, t in enumerate(tokens) if isinstance(t, bytes)), None)


def text_only_error(where: str, position: int) -> ValueError:
    return ValueError(f"{where}: token {position} is a multimodal digest, which a text_only KV cache refuses")


class RequestStats:
    """One cache's feed: the manager's statistics unless its id is excluded, and its own pending
    delta when it was created with ``enable_request_stats``."""

    def __init__(
        self, book: StatsBook, cache_id: int, enabled: bool, expected_prompt_length: int, text_only: bool
    ) -> None:
        self.book = book
        self.cache_id = cache_id
        self.enabled = enabled
        self.expected_prompt_length = expected_prompt_length
        self.text_only = text_only
        self.excluded = cache_id in book.excluded  # kept in step by mark_stats_excluded
        self.tokens_per_block = book.context.tokens_per_block
        # A block starting at or past this ordinal holds generated tokens only.
        self.first_generation_block = -(-expected_prompt_length // self.tokens_per_block)
        self.pending = dict.fromkeys(_DELTA_FIELDS, 0)

    def _add_pending(self, **counts: int) -> None:
        for name, value in counts.items():
            self.pending[name] += value
        if any(counts.values()):
            self.book.dirty.add(self.cache_id)

    def created(self, lookup_tokens: int, reused_tokens: int, reused_snapshot: bool, misses: Misses | None) -> None:
        if not self.excluded:
            self.book.context.add_stats(requests=1, lookup_tokens=lookup_tokens, reused_tokens=reused_tokens)
            self.book.ssm_reused += reused_snapshot
            if misses is not None:
                self.book.context.add_stats(
                    miss_stale_tokens=misses.stale,
                    miss_capped_tokens=misses.capped,
                    miss_evicted_tokens=misses.evicted,
                    miss_partial_tokens=misses.partial,
                    miss_never_seen_tokens=misses.never_seen,
                    miss_other_scope_tokens=misses.other_scope,
                )
        if self.enabled:
            self._add_pending(lookup_tokens=lookup_tokens, reused_tokens=reused_tokens)

    def allocated(self, needs: list[tuple[int, int]]) -> None:
        """Pages for ``needs`` (ordinal, layer group) were handed to the cache."""
        if not self.excluded:
            self.book.context.add_stats(allocated_pages=len(needs))
            for _, group in needs:
                self.book.allocated[group] += 1
        if self.enabled:
            first = self.first_generation_block
            generation = sum(1 for o, _ in needs if o >= first)
            self._add_pending(allocated_pages=len(needs), generation_allocated_pages=generation)

    def committed_block(self) -> None:
        if not self.excluded:
            self.book.context.add_stats(committed_blocks=1)
        if self.enabled:
            self._add_pending(committed_blocks=1)

    def attached(self, layer_group: int) -> None:
        """One of the cache's pages entered the tree in ``layer_group``."""
        if not self.excluded:
            self.book.committed[layer_group] += 1
            self.book.ssm_stored += self.book.is_ssm[layer_group]

    def snapshot_skipped(self, layer_groups: list[int]) -> None:
        """A commit found no room to copy its states in ``layer_groups`` (SSM ones count)."""
        if not self.excluded:
            self.book.ssm_skipped += sum(1 for group in layer_groups if self.book.is_ssm[group])

    def _require_enabled(self, api: str) -> None:
        if not self.enabled:
            raise LogicError(f"{api}() needs a KV cache created with enable_request_stats=True")

    def commit(self) -> KVCacheStatsDelta:
        self._require_enabled("commit_pending_stats")
        out = KVCacheStatsDelta(**self.pending)
        self.pending = dict.fromkeys(_DELTA_FIELDS, 0)
        self.book.dirty.discard(self.cache_id)
        return out

    def discard(self) -> None:
        self._require_enabled("discard_pending_stats")
        self.pending = dict.fromkeys(_DELTA_FIELDS, 0)
        self.book.dirty.discard(self.cache_id)


_DELTA_FIELDS = list(KVCacheStatsDelta.__dataclass_fields__)
