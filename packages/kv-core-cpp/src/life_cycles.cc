#include "kvcore/life_cycles.h"

#include <algorithm>

#include "kvcore/constants.h"
#include "kvcore/error.h"

namespace kvcore {

LifeCycleRegistry::LifeCycleRegistry(const KVCacheManagerConfig& config) : tokens_per_block_(config.tokens_per_block) {
  for (std::size_t i = 0; i < config.layers.size(); ++i) {
    const LayerConfig& layer = config.layers[i];
    const bool ssm = layer.ssm;
    const auto window = ssm ? std::nullopt : layer.sliding_window_size;
    // No window means no sinks (a count of 0 is allowed there): a plain full-attention layer.
    const std::int64_t sinks = window ? ceil_div(layer.num_sink_tokens.value_or(0), tokens_per_block_) : 0;
    auto it = std::find_if(life_cycles_.begin(), life_cycles_.end(), [&](const LifeCycle& lc) {
      return lc.window == window && lc.num_sink_blocks == sinks && lc.ssm == ssm;
    });
    int id;
    if (it == life_cycles_.end()) {
      id = static_cast<int>(life_cycles_.size());
      life_cycles_.push_back({id, window, sinks, ssm});
      (ssm ? ssm_life_cycles_ : block_life_cycles_).push_back(id);
    } else {
      id = it->id;
    }
    layers_.emplace_back(layer.layer_id, id);
    layer_index_[layer.layer_id] = id;
  }
}

int LifeCycleRegistry::life_cycle_of(std::int64_t layer_id) const {
  const auto it = layer_index_.find(layer_id);
  if (it == layer_index_.end()) throw Error(ErrorKind::kKey, "no layer " + std::to_string(layer_id));
  return it->second;
}

std::pair<std::int64_t, std::int64_t> LifeCycleRegistry::stale_range(int life_cycle, std::int64_t history) const {
  const LifeCycle& lc = life_cycles_[life_cycle];
  if (lc.ssm) return {0, history / tokens_per_block_};
  const std::int64_t s = std::min(ceil_div(history, tokens_per_block_), lc.num_sink_blocks);
  if (!lc.window) return {s, s};
  // Floor division as Python's: history + 1 - window may be negative.
  const std::int64_t n = history + 1 - *lc.window;
  const std::int64_t q = n >= 0 ? n / tokens_per_block_ : -ceil_div(-n, tokens_per_block_);
  return {s, std::max(s, q)};
}

std::int64_t LifeCycleRegistry::min_slots_floor(int life_cycle) const {
  const std::int64_t tpb = tokens_per_block_;
  auto floor_of = [tpb](const LifeCycle& lc) { return lc.num_sink_blocks + (*lc.window + tpb - 2) / tpb + 1; };
  const LifeCycle& lc = life_cycles_[life_cycle];
  if (lc.ssm) return 1;
  if (lc.window) return floor_of(lc);
  std::int64_t best = 0;
  for (const LifeCycle& other : life_cycles_) {
    if (other.window) best = std::max(best, floor_of(other));
  }
  return best ? best : 1;
}

}  // namespace kvcore
