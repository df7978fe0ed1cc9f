// The KV-cache manager: owns pools, the radix tree, eviction, events and statistics.
#pragma once

#include <cstddef>

namespace kvcore {

struct ManagerConfig {
  std::size_t tokens_per_block = 32;
};

class Manager {
 public:
  explicit Manager(const ManagerConfig& config) : config_(config) {}
  std::size_t tokens_per_block() const noexcept { return config_.tokens_per_block; }

 private:
  ManagerConfig config_;
};

}  // namespace kvcore
