"""The auto-tuner (docs/manager.md, "Rebalancing"): learns what a typical request needs from the
caches that close, and re-splits the device quota between pool groups to match.

Every float step happens in the same order in the native backend (rebalancer.cc), so both
backends learn the same target ratio and plan the same slot counts.
"""

from __future__ import annotations

import math
import time

from kv_api.config import BatchDesc, KVCacheDesc, KVCacheManagerConfig
from kv_api.constants import TOKEN_LIMIT
from kv_core_py.life_cycles import LifeCycleRegistry
from kv_core_py.scratch import scratch_rules
from kv_core_py.slot_counts import SlotCounts, bytes_ratio, slots_for_batch
from kv_core_py.storage_config import StorageConfig

#: Lengths learnt are capped below TOKEN_LIMIT (as every cache's are), so they convert to an int.
_LENGTH_CAP = float(TOKEN_LIMIT - 1)


def _length(mean: float) -> int:
    """A learnt length: rounded half to even, as the native backend's nearbyint."""
    return round(min(mean, _LENGTH_CAP))


class Rebalancer:
    """Owned by the manager's ``CacheContext``: closing caches feed ``sample``, the manager asks
    ``need_adjustment`` and ``plan`` and reports ``adjusted``."""

    def __init__(self, config: KVCacheManagerConfig, registry: LifeCycleRegistry, storage: StorageConfig) -> None:
        self._config = config
        self._registry = registry
        self._storage = storage
        self._scratch = scratch_rules(config, registry, storage)  # as the initial ratio counts scratch
        self._decay = config.rebalance_moving_average_decay
        self.num_sampled = 0
        # Decayed sums: each mean is its sum over the decayed weight, so the first samples are not
        # biased towards zero as a moving average started at zero would be.
        self._weight = 0.0
        self._reused = 0.0
        self._capacity_sq = 0.0
        self._history_sq = 0.0
        #: Per pool group, the share of the device quota the samples call for (None: not learnt yet).
        self.target: list[float] | None = None
        #: The ratio the device level was last split by (None: the initial ratio).
        self.applied: list[float] | None = None
        self._last_adjust = time.monotonic()  # the cooldown runs from the manager's construction

    def sample(self, reused: int, capacity: int, history: int) -> None:
        """A closing cache's lengths: decay the sums, add these, and every
        ``rebalance_target_ratio_update_interval`` samples learn the target ratio again."""
        d = self._decay
        c, h = float(capacity), float(history)
        self._weight = self._weight * d + 1.0
        self._reused = self._reused * d + float(reused)
        self._capacity_sq = self._capacity_sq * d + c * c
        self._history_sq = self._history_sq * d + h * h
        self.num_sampled += 1
        if self.num_sampled % self._config.rebalance_target_ratio_update_interval == 0:
            self.target = self.target_ratio()

    def typical_request(self) -> tuple[KVCacheDesc, int]:
        """The typical request: capacity ``sqrt(E[capacity²])``, history ``sqrt(E[history²])``
        (root mean squares: a long request weighs as much as the memory it takes), and its
        reused prefix ``E[reused]``, each rounded and clamped so reused <= history <= capacity."""
        w = self._weight
        capacity = _length(math.sqrt(self._capacity_sq / w))
        history = min(capacity, _length(math.sqrt(self._history_sq / w)))
        reused = min(history, _length(self._reused / w))
        return KVCacheDesc(capacity, history), reused

    def target_ratio(self) -> list[float]:
        """Per pool group, its share of the bytes one more typical request needs in a batch of
        them sharing the reused prefix as a system prompt: the slots of two such requests less
        those of one (``slots_for_batch``, scratch blocks at their scratch cost), weighed by slot
        bytes as the initial ratio is."""
        desc, reused = self.typical_request()
        one, two = BatchDesc([desc], reused), BatchDesc([desc, desc], reused)
        reg = self._registry
        rules = self._scratch
        slots = [
            sum(
                slots_for_batch(reg, group, two, rules[group]) - slots_for_batch(reg, group, one, rules[group])
                for group in pg.life_cycles
            )
            for pg in self._storage.pool_groups
        ]
        return bytes_ratio(slots, self._storage.pool_groups)

    def plan(self, quota: int) -> SlotCounts | None:
        """The device level's slot counts at ``quota`` split by the target ratio (minimum slots
        kept); None before a target is learnt."""
        if self.target is None:
            return None
        return SlotCounts(self._config, self._registry, self._storage, 0, quota, self.target)

    def need_adjustment(self, current: SlotCounts) -> bool:
        """Enough caches sampled, the cooldown over, and some pool group's slots off the plan by
        more than the threshold factor either way."""
        config = self._config
        if self.num_sampled < config.rebalance_min_sampled_kv_caches:
            return False
        if time.monotonic() - self._last_adjust < config.rebalance_cooldown_secs:
            return False
        plan = self.plan(current.quota)
        if plan is None:
            return False
        t = config.rebalance_ratio_threshold
        return any(
            float(now) > float(new) * t or float(new) > float(now) * t
            for now, new in zip(current.slots, plan.slots, strict=True)
        )

    def adjusted(self, ratio: list[float] | None) -> None:
        """``adjust()`` ran: the cooldown starts again; ``ratio`` (if any) now splits the device."""
        self._last_adjust = time.monotonic()
        if ratio is not None:
            self.applied = ratio
