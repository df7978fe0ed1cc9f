// From a device quota to slot counts per pool group (docs/manager.md, "Pools"; mirrors
// slot_counts.py, whose results it must match exactly: integer arithmetic, and the ratio split in
// the same float order, ties to even).
//
// The functions read only their arguments (the registry and storage config being fixed) and need
// no lock. A SlotCounts is a value: each CacheLevel keeps the one it is sized by, replaced under
// the manager's lock by a quota resize or adjust().
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/life_cycles.h"
#include "kvcore/scratch.h"
#include "kvcore/storage_config.h"

namespace kvcore {

std::uint64_t gpu_granularity(std::uint64_t quota);
// A tier's granularity: the device's by its quota, host 4 KiB, disk 2 MiB.
std::uint64_t tier_granularity(CacheTier tier, std::uint64_t quota);
const char* tier_name(CacheTier tier);  // "device", "host", "disk"
std::uint64_t grains_for(std::uint64_t slots, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t granularity);
std::uint64_t max_slots(std::uint64_t grains, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t granularity);
// With a scratch rule, a request's scratch blocks have no page of their own: their n cost rule->slots(n).
std::int64_t slots_for_batch(const LifeCycleRegistry& registry, int layer_group, const BatchDesc& batch,
                             const ScratchRule* scratch = nullptr);
// The most slots one layer group needs at once for a request growing one token per step to
// `length` tokens (slot_counts.py's sequence_peak_slots).
std::int64_t sequence_peak_slots(const LifeCycleRegistry& registry, int layer_group, std::int64_t length);
// The largest multiple of tokens_per_block <= upper_bound such that batch_size - 1 one-token
// requests and one request growing to it fit `slots` in every pool group; 0 if none does.
std::int64_t clamp_max_seq_len(const LifeCycleRegistry& registry, const StorageConfig& storage,
                               const std::vector<std::uint64_t>& slots, std::int64_t batch_size,
                               std::int64_t upper_bound);
// Each pool group's share of the bytes of `slots` (per pool group); equal shares when there are none.
std::vector<double> bytes_ratio(const std::vector<std::uint64_t>& slots, const std::vector<PoolGroupConfig>& groups);

class SlotCounts {
 public:
  // The counts of cache level `level` (config.cache_tiers[level]: its quota and granularity).
  // `quota` overrides the tier's (a quota resize), `ratio` (per pool group) the initial one (the
  // auto-tuner's).
  SlotCounts(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry, const StorageConfig& storage,
             int level = 0, std::optional<std::uint64_t> quota = std::nullopt,
             const std::optional<std::vector<double>>& ratio = std::nullopt);

  std::uint64_t min_quota = 0;  // the bytes the minimum slots occupy

  std::uint64_t granularity = 0;

  std::uint64_t quota = 0;               // effective
  std::vector<std::uint64_t> min_slots;  // per pool group
  std::vector<std::uint64_t> slots;      // per pool group
};

}  // namespace kvcore
