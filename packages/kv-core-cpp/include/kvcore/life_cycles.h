// Life cycles: layers whose pages live and die together, and their stale block ranges.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/life_cycle_kinds.h"

namespace kvcore {

// Ids by first appearance in config.layers; attention layers with the same (window, sink blocks)
// share one, and every SSM layer shares the one SSM life cycle. The id doubles as the layer-group
// id.
class LifeCycleRegistry {
 public:
  explicit LifeCycleRegistry(const KVCacheManagerConfig& config);

  const std::vector<LifeCycle>& life_cycles() const { return life_cycles_; }
  std::size_t size() const { return life_cycles_.size(); }
  std::int64_t tokens_per_block() const { return tokens_per_block_; }
  // Layer ids with their life cycle, in config order.
  const std::vector<std::pair<std::int64_t, int>>& layers() const { return layers_; }
  int life_cycle_of(std::int64_t layer_id) const;  // throws Error(kKey)
  // Life cycles with a page per block (attention), and the SSM one (at most one).
  const std::vector<int>& block_life_cycles() const { return block_life_cycles_; }
  const std::vector<int>& ssm_life_cycles() const { return ssm_life_cycles_; }
  // A life cycle's kind: what differs between full attention, windows and SSM.
  const LifeCycleKind& kind(int life_cycle) const { return *kinds_[static_cast<std::size_t>(life_cycle)]; }

  // Blocks [first, second) not needed for the next step at `history` tokens (the rule of
  // kv_api.LifeCycle.get_stale_range, which priority callbacks see).
  std::pair<std::int64_t, std::int64_t> stale_range(int life_cycle, std::int64_t history) const {
    return kinds_[static_cast<std::size_t>(life_cycle)]->stale_range(history);
  }
  bool is_stale(int life_cycle, std::int64_t ordinal, std::int64_t history) const {
    const auto r = stale_range(life_cycle, history);
    return r.first <= ordinal && ordinal < r.second;
  }
  // Slots one request may need at once (LifeCycleKind::slots_floor).
  std::int64_t min_slots_floor(int life_cycle) const;

 private:
  std::int64_t tokens_per_block_;
  std::vector<LifeCycle> life_cycles_;
  std::vector<std::shared_ptr<const LifeCycleKind>> kinds_;
  std::vector<int> block_life_cycles_;
  std::vector<int> ssm_life_cycles_;
  std::vector<std::pair<std::int64_t, int>> layers_;
  std::map<std::int64_t, int> layer_index_;
};

}  // namespace kvcore
