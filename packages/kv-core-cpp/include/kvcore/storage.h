// Pool groups at the device level: slot allocators, real memory, eviction, and what dropping
// a committed page does to the radix tree (see storage.py).
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "kvcore/event_manager.h"
#include "kvcore/eviction.h"
#include "kvcore/life_cycles.h"
#include "kvcore/memory_pool.h"
#include "kvcore/page.h"
#include "kvcore/radix_tree.h"
#include "kvcore/slot_allocator.h"
#include "kvcore/slot_counts.h"
#include "kvcore/storage_config.h"

namespace kvcore {

struct StorageStatistics {
  std::uint64_t total = 0;
  std::uint64_t free = 0;
  std::uint64_t evictable = 0;
};

class PoolGroup {
 public:
  PoolGroup(int index, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t num_slots);

  int index;
  SlotAllocator allocator;
  std::vector<MemoryPool> pools;
  EvictionQueue evictable;
  // By slot, grown as fresh slots are issued (0, 1, 2, ...) so the quota costs nothing up front;
  // a deque grown at the back never moves the pages pointed to.
  std::deque<Page> pages;

  StorageStatistics statistics() const { return {allocator.num_slots(), allocator.num_free(), evictable.size()}; }
  double utilization() const;
};

class Storage {
 public:
  Storage(const StorageConfig& config, const SlotCounts& counts, const LifeCycleRegistry& registry, RadixTree& tree,
          KVCacheEventManager* events);

  std::deque<PoolGroup>& pool_groups() { return pool_groups_; }
  const StorageConfig& config() const { return config_; }
  std::vector<StorageStatistics> statistics() const;
  // One page per (life cycle, priority), all or none (Error kOutOfPages).
  std::vector<Page*> new_pages(const std::vector<std::pair<int, int>>& requests);
  void copy(const Page* src, const Page* dst);
  void free(Page* page);
  void hold(Page* page);
  void unhold(Page* page);
  // `block` replaces `sibling`, a partial block whose tokens it extends (see Storage.adopt).
  void adopt(Block* block, Block* sibling);
  // `page` leaves the tree undropped (a wider page or a longer block replaced it): freed now if
  // nobody holds it, else when its holders let go, as an uncommitted page is.
  void orphan(Page* page);
  void drop(Page* page);
  void clear();
  std::uint64_t num_evicted = 0;

 private:
  void discard(Block* block, int life_cycle);

  const StorageConfig& config_;
  const LifeCycleRegistry& registry_;
  RadixTree& tree_;
  KVCacheEventManager* events_;
  std::deque<PoolGroup> pool_groups_;  // a deque: pages point into each group, which never moves
};

}  // namespace kvcore
