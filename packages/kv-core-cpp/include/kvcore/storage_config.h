// How buffers are coalesced into pools and layer groups into pool groups (docs/manager.md,
// "Pools"; mirrors storage_config.py). Built once with the manager and never changed after (only
// const members): any thread may read it without the lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/life_cycles.h"

namespace kvcore {

// Where one buffer lives: the position-th of `scale` buffers of `size` bytes in each slot of
// pool `pool` of its layer group's pool group.
struct BufferPlacement {
  int layer_group = 0;
  int pool = 0;
  std::int64_t position = 0;
  std::int64_t scale = 0;
  std::uint64_t size = 0;       // bytes per block, expanded
  std::uint64_t page_size = 0;  // bytes per page: size / expansion
  std::int64_t expansion = 1;
};

struct PoolGroupConfig {
  int index = 0;
  std::vector<int> life_cycles;           // its layer groups, named as kv_api.PoolGroupDesc.life_cycles
  std::vector<std::uint64_t> slot_sizes;  // one per pool, descending
  std::uint64_t slot_bytes() const;
};

class StorageConfig {
 public:
  StorageConfig(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry);

  const std::vector<PoolGroupConfig>& pool_groups() const { return pool_groups_; }
  int pool_group_of(int layer_group) const { return layer_group_pool_group_[layer_group]; }
  const BufferPlacement& placement(std::int64_t layer_id, const std::string& role) const;  // Error(kKey)

 private:
  std::map<std::pair<std::int64_t, std::string>, BufferPlacement> placements_;
  std::vector<PoolGroupConfig> pool_groups_;
  std::vector<int> layer_group_pool_group_;
};

}  // namespace kvcore
