// The auto-tuner (docs/manager.md, "Rebalancing"; mirrors rebalancer.py): learns what a typical
// request needs from the caches that close, and plans the device level's split between pool
// groups to match. Every float step is rebalancer.py's, in the same order, so both backends learn
// the same ratio.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/life_cycles.h"
#include "kvcore/scratch.h"
#include "kvcore/slot_counts.h"
#include "kvcore/storage_config.h"

namespace kvcore {

// Owned by the manager's CacheContext: closing caches feed sample(), the manager asks
// need_adjustment() and plan() and reports adjusted(). It borrows the manager's config, registry
// and storage config, fixed and declared before the context. Every member REQUIRES: the
// manager's lock (the thread rule: docs/architecture.md, Threads).
class Rebalancer {
 public:
  Rebalancer(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry, const StorageConfig& storage);

  // A closing cache's lengths: decay the sums, add these, and every
  // rebalance_target_ratio_update_interval samples learn the target ratio again.
  void sample(std::int64_t reused, std::int64_t capacity, std::int64_t history);
  // The typical request (root mean square capacity and history, mean reused prefix) and its
  // reused length.
  std::pair<KVCacheDesc, std::int64_t> typical_request() const;
  // Per pool group, its share of the bytes one more typical request needs.
  std::vector<double> target_ratio() const;
  // The device level's slot counts at `quota` split by the target ratio; none before one is learnt.
  std::optional<SlotCounts> plan(std::uint64_t quota) const;
  bool need_adjustment(const SlotCounts& current) const;
  // adjust() ran: the cooldown starts again; `ratio` (if any) now splits the device.
  void adjusted(const std::optional<std::vector<double>>& ratio);

  std::uint64_t num_sampled = 0;
  std::optional<std::vector<double>> target;   // per pool group
  std::optional<std::vector<double>> applied;  // none: the initial ratio

 private:
  using Clock = std::chrono::steady_clock;

  const KVCacheManagerConfig& config_;
  const LifeCycleRegistry& registry_;
  const StorageConfig& storage_;
  std::vector<std::optional<ScratchRule>> scratch_;  // per layer group (scratch_rules)
  // Decayed sums: each mean is its sum over the decayed weight.
  double weight_ = 0.0;
  double reused_ = 0.0;
  double capacity_sq_ = 0.0;
  double history_sq_ = 0.0;
  Clock::time_point last_adjust_;  // the cooldown runs from the manager's construction
};

}  // namespace kvcore
