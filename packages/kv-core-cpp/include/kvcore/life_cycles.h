// Layer groups (layers whose pages live and die together), their life cycles and stale block
// ranges (docs/manager.md, "Vocabulary"; mirrors life_cycles.py).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/life_cycle_kinds.h"

namespace kvcore {

// Layer groups by first appearance in config.layers; attention layers with the same (window, sink
// blocks) share one, and every SSM layer shares the one SSM layer group. A group's life cycle has
// the group as its id (LifeCycle::id). Built once with the manager from its config and never
// changed after (only const members); it owns each layer group's LifeCycleKind. Any thread may
// read it without the lock (the thread rule: docs/architecture.md, Threads).
class LifeCycleRegistry {
 public:
  explicit LifeCycleRegistry(const KVCacheManagerConfig& config);

  const std::vector<LifeCycle>& life_cycles() const { return life_cycles_; }
  std::size_t size() const { return life_cycles_.size(); }
  std::int64_t tokens_per_block() const { return tokens_per_block_; }
  // Layer ids with their layer group, in config order.
  const std::vector<std::pair<std::int64_t, int>>& layers() const { return layers_; }
  int layer_group_of(std::int64_t layer_id) const;  // throws Error(kKey)
  // Layer groups with a page per block (attention), and the SSM one (at most one).
  const std::vector<int>& block_layer_groups() const { return block_layer_groups_; }
  const std::vector<int>& ssm_layer_groups() const { return ssm_layer_groups_; }
  // A layer group's life-cycle kind: what differs between full attention, windows and SSM.
  const LifeCycleKind& kind(int layer_group) const { return *kinds_[static_cast<std::size_t>(layer_group)]; }

  // Blocks [first, second) not needed for the next step at `history` tokens (the rule of
  // kv_api.LifeCycle.get_stale_range, which priority callbacks see).
  std::pair<std::int64_t, std::int64_t> stale_range(int layer_group, std::int64_t history) const {
    return kinds_[static_cast<std::size_t>(layer_group)]->stale_range(history);
  }
  bool is_stale(int layer_group, std::int64_t ordinal, std::int64_t history) const {
    const auto r = stale_range(layer_group, history);
    return r.first <= ordinal && ordinal < r.second;
  }
  // Slots one request may need at once (LifeCycleKind::slots_floor).
  std::int64_t min_slots_floor(int layer_group) const;

 private:
  std::int64_t tokens_per_block_;
  std::vector<LifeCycle> life_cycles_;
  std::vector<std::shared_ptr<const LifeCycleKind>> kinds_;
  std::vector<int> block_layer_groups_;
  std::vector<int> ssm_layer_groups_;
  std::vector<std::pair<std::int64_t, int>> layers_;
  std::map<std::int64_t, int> layer_index_;
};

}  // namespace kvcore
