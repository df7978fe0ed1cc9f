#include "kvcore/storage_config.h"

#include <algorithm>

#include "kvcore/error.h"

namespace kvcore {

std::uint64_t PoolGroupConfig::slot_bytes() const {
  std::uint64_t total = 0;
  for (std::uint64_t s : slot_sizes) total += s;
  return total;
}

namespace {

struct Member {
  std::int64_t layer_id;
  std::string role;
  std::int64_t expansion;
};

struct SizeGroup {
  std::uint64_t size;
  std::vector<Member> members;
};

}  // namespace

StorageConfig::StorageConfig(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry) {
  const std::int64_t tokens_per_block = config.tokens_per_block;
  std::vector<std::vector<SizeGroup>> per_layer_group(registry.size());
  for (const LayerConfig& layer : config.layers) {
    auto& groups = per_layer_group[registry.layer_group_of(layer.layer_id)];
    for (const BufferConfig& b : layer.buffers) {
      const std::int64_t expansion =
          b.tokens_per_block_override ? tokens_per_block / static_cast<std::int64_t>(*b.tokens_per_block_override) : 1;
      const std::uint64_t size = b.size * static_cast<std::uint64_t>(expansion);
      auto it = std::find_if(groups.begin(), groups.end(), [&](const SizeGroup& g) { return g.size == size; });
      if (it == groups.end()) {
        groups.push_back({size, {}});
        it = groups.end() - 1;
      }
      it->members.push_back({layer.layer_id, b.role, expansion});
    }
  }
  for (int layer_group = 0; layer_group < static_cast<int>(per_layer_group.size()); ++layer_group) {
    std::vector<SizeGroup> pools = per_layer_group[layer_group];
    std::stable_sort(pools.begin(), pools.end(), [](const SizeGroup& a, const SizeGroup& b) {
      return a.size * a.members.size() > b.size * b.members.size();
    });
    std::vector<std::uint64_t> slot_sizes;
    for (int pool = 0; pool < static_cast<int>(pools.size()); ++pool) {
      const SizeGroup& g = pools[pool];
      slot_sizes.push_back(g.size * g.members.size());
      for (std::size_t pos = 0; pos < g.members.size(); ++pos) {
        const Member& m = g.members[pos];
        placements_[{m.layer_id, m.role}] = {layer_group,
                                             pool,
                                             static_cast<std::int64_t>(pos),
                                             static_cast<std::int64_t>(g.members.size()),
                                             g.size,
                                             g.size / static_cast<std::uint64_t>(m.expansion),
                                             m.expansion};
      }
    }
    auto match = std::find_if(pool_groups_.begin(), pool_groups_.end(),
                              [&](const PoolGroupConfig& pg) { return pg.slot_sizes == slot_sizes; });
    if (match == pool_groups_.end()) {
      pool_groups_.push_back({static_cast<int>(pool_groups_.size()), {layer_group}, slot_sizes});
      layer_group_pool_group_.push_back(pool_groups_.back().index);
    } else {
      match->life_cycles.push_back(layer_group);
      layer_group_pool_group_.push_back(match->index);
    }
  }
}

const BufferPlacement& StorageConfig::placement(std::int64_t layer_id, const std::string& role) const {
  const auto it = placements_.find({layer_id, role});
  if (it == placements_.end()) {
    throw Error(ErrorKind::kKey, "no buffer '" + role + "' in layer " + std::to_string(layer_id));
  }
  return it->second;
}

}  // namespace kvcore
