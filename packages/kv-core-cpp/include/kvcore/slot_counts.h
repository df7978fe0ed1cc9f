// From a device quota to slot counts per pool group (see slot_counts.py; results must match it
// exactly: integer arithmetic, and the ratio split in the same float order, ties to even).
#pragma once

#include <cstdint>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/life_cycles.h"
#include "kvcore/storage_config.h"

namespace kvcore {

std::uint64_t gpu_granularity(std::uint64_t quota);
std::uint64_t grains_for(std::uint64_t slots, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t granularity);
std::uint64_t max_slots(std::uint64_t grains, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t granularity);
std::int64_t slots_for_batch(const LifeCycleRegistry& registry, int life_cycle, const BatchDesc& batch);

class SlotCounts {
 public:
  SlotCounts(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry, const StorageConfig& storage);

  std::uint64_t quota = 0;               // effective
  std::vector<std::uint64_t> min_slots;  // per pool group
  std::vector<std::uint64_t> slots;      // per pool group
};

}  // namespace kvcore
