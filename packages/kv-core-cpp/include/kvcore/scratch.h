// Sliding-window scratch reuse (docs/manager.md, "Sliding-window scratch"; mirrors scratch.py):
// which blocks of a step are scratch, and how many shared slots they take. A ScratchRule is a
// value, fixed once built (the CacheContext and the rebalancer keep theirs for the manager's
// life), and these functions touch no other state: no lock.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/life_cycles.h"
#include "kvcore/storage_config.h"

namespace kvcore {

// One sliding-window layer group's scratch. layer_bytes / slot_bytes is slot_util_frac_max: the
// largest share of the layer group's slot one of its layers takes, kept as two integers so both
// backends round alike.
struct ScratchRule {
  int layer_group = 0;
  std::int64_t max_rewind_len = 0;
  std::uint64_t layer_bytes = 0;
  std::uint64_t slot_bytes = 0;

  // stale(max(0, capacity - max_rewind_len)) ∩ [ceil(history / tokens_per_block), ceil(capacity / tokens_per_block)):
  // empty as {lo, lo}.
  std::pair<std::int64_t, std::int64_t> range(const LifeCycleRegistry& registry, std::int64_t capacity,
                                              std::int64_t history) const;
  // ceil(num_blocks × slot_util_frac_max).
  std::int64_t slots(std::int64_t num_blocks) const;
};

// Per layer group, its scratch rule: sliding-window layer groups when the config has
// swa_scratch_reuse, else none.
std::vector<std::optional<ScratchRule>> scratch_rules(const KVCacheManagerConfig& config,
                                                      const LifeCycleRegistry& registry, const StorageConfig& storage);

}  // namespace kvcore
