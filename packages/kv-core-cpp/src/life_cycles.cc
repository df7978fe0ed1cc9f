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
    auto it = std::find_if(life_cycles_.begin(), life_cycles_.end(), [&](const LifeCycle& life) {
      return life.window == window && life.num_sink_blocks == sinks && life.ssm == ssm;
    });
    int id;
    if (it == life_cycles_.end()) {
      id = static_cast<int>(life_cycles_.size());
      life_cycles_.push_back({id, window, sinks, ssm});
      kinds_.push_back(kind_of(life_cycles_.back(), tokens_per_block_));
      (kinds_.back()->has_block_pages() ? block_layer_groups_ : ssm_layer_groups_).push_back(id);
    } else {
      id = it->id;
    }
    layers_.emplace_back(layer.layer_id, id);
    layer_index_[layer.layer_id] = id;
  }
}

int LifeCycleRegistry::layer_group_of(std::int64_t layer_id) const {
  const auto it = layer_index_.find(layer_id);
  if (it == layer_index_.end()) throw Error(ErrorKind::kKey, "no layer " + std::to_string(layer_id));
  return it->second;
}

std::int64_t LifeCycleRegistry::min_slots_floor(int layer_group) const {
  std::vector<std::int64_t> window_floors;
  for (const auto& kind : kinds_) {
    if (const auto* window = dynamic_cast<const SlidingWindow*>(kind.get()))
      window_floors.push_back(window->window_floor());
  }
  return kind(layer_group).slots_floor(window_floors);
}

}  // namespace kvcore
