#include "kvcore/rebalancer.h"

#include <algorithm>
#include <cmath>

#include "kvcore/constants.h"

namespace kvcore {

namespace {

// Lengths learnt are capped below TOKEN_LIMIT (as every cache's are), so they convert to an int;
// rounded half to even, as Python's round().
constexpr double kLengthCap = static_cast<double>(kTokenLimit - 1);  // exact

std::int64_t learnt_length(double mean) {
  return static_cast<std::int64_t>(std::nearbyint(std::min(mean, kLengthCap)));
}

}  // namespace

Rebalancer::Rebalancer(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry,
                       const StorageConfig& storage)
    : config_(config),
      registry_(registry),
      storage_(storage),
      scratch_(scratch_rules(config, registry, storage)),
      last_adjust_(Clock::now()) {}

void Rebalancer::sample(std::int64_t reused, std::int64_t capacity, std::int64_t history) {
  const double d = config_.rebalance_moving_average_decay;
  const double c = static_cast<double>(capacity), h = static_cast<double>(history);
  weight_ = weight_ * d + 1.0;
  reused_ = reused_ * d + static_cast<double>(reused);
  capacity_sq_ = capacity_sq_ * d + c * c;
  history_sq_ = history_sq_ * d + h * h;
  ++num_sampled;
  if (num_sampled % config_.rebalance_target_ratio_update_interval == 0) target = target_ratio();
}

std::pair<KVCacheDesc, std::int64_t> Rebalancer::typical_request() const {
  const std::int64_t capacity = learnt_length(std::sqrt(capacity_sq_ / weight_));
  const std::int64_t history = std::min(capacity, learnt_length(std::sqrt(history_sq_ / weight_)));
  const std::int64_t reused = std::min(history, learnt_length(reused_ / weight_));
  return {KVCacheDesc{capacity, history}, reused};
}

std::vector<double> Rebalancer::target_ratio() const {
  const auto [desc, reused] = typical_request();
  const BatchDesc one{{desc}, reused}, two{{desc, desc}, reused};
  std::vector<std::uint64_t> slots;
  for (const PoolGroupConfig& pg : storage_.pool_groups()) {
    std::int64_t n = 0;
    for (int group : pg.life_cycles) {
      const ScratchRule* rule = scratch_[group] ? &*scratch_[group] : nullptr;  // as the initial ratio counts scratch
      n += slots_for_batch(registry_, group, two, rule) - slots_for_batch(registry_, group, one, rule);
    }
    slots.push_back(static_cast<std::uint64_t>(n));
  }
  return bytes_ratio(slots, storage_.pool_groups());
}

std::optional<SlotCounts> Rebalancer::plan(std::uint64_t quota) const {
  if (!target) return std::nullopt;
  return SlotCounts(config_, registry_, storage_, 0, quota, *target);
}

bool Rebalancer::need_adjustment(const SlotCounts& current) const {
  if (num_sampled < config_.rebalance_min_sampled_kv_caches) return false;
  const double elapsed = std::chrono::duration<double>(Clock::now() - last_adjust_).count();
  if (elapsed < config_.rebalance_cooldown_secs) return false;
  const std::optional<SlotCounts> planned = plan(current.quota);
  if (!planned) return false;
  const double t = config_.rebalance_ratio_threshold;
  for (std::size_t p = 0; p < current.slots.size(); ++p) {
    const double now = static_cast<double>(current.slots[p]), next = static_cast<double>(planned->slots[p]);
    if (now > next * t || next > now * t) return true;
  }
  return false;
}

void Rebalancer::adjusted(const std::optional<std::vector<double>>& ratio) {
  last_adjust_ = Clock::now();
  if (ratio) applied = ratio;
}

}  // namespace kvcore
