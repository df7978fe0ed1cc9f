// One cache level (device, host or disk tier): its pool groups, each with a slot allocator, its
// memory (or disk files) and its eviction queue, sized by the level's slot counts
// (docs/manager.md, "Eviction and tiers"; mirrors cache_level.py).
//
// Storage owns the levels; a level owns its pool groups, and a pool group its allocator, pools,
// disk files and eviction queue (which links Storage's page records and owns none). A quota
// resize keeps the memory it replaces mapped in retired_pools for the manager's life, so a view
// exported before (which holds the manager) stays readable. Every member REQUIRES: the manager's
// lock (the thread rule: docs/architecture.md, Threads).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/disk_pool.h"
#include "kvcore/error.h"
#include "kvcore/eviction.h"
#include "kvcore/memory_pool.h"
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
  // Memory pools, or with `disk_directory` one file per pool there; `populating`:
  // config.populate_memory.
  PoolGroup(int index, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t num_slots,
            const std::string* disk_directory, bool populating = true);

  int index;
  bool populating;
  SlotAllocator allocator;
  std::vector<MemoryPool> pools;     // memory tiers
  std::vector<DiskPool> disk_pools;  // the disk tier
  std::vector<std::uint64_t> slot_sizes;
  EvictionQueue evictable;
  std::vector<MemoryPool> retired_pools;  // replaced by a quota resize, kept for the views exported

  std::uint64_t num_slots() const { return allocator.num_slots(); }
  // n slot ids (allocator.allocate's), the memory below every fresh one committed (populate).
  std::vector<std::uint64_t> allocate(std::uint64_t n);
  void allocate(std::uint64_t n, std::vector<std::uint64_t>& out);  // appended to `out`
  // Commits the memory pools' bytes of the slots below `end` (MemoryPool::populate): before
  // anything is copied or written into them. Not where populate_memory is off.
  void populate(std::uint64_t end);
  // The pools a resize to num_slots maps (Error(kHostOOM) before anything changes).
  std::vector<MemoryPool> new_memory(std::uint64_t num_slots) const;
  // Takes `memory` (from new_memory) as the pools, copying the `occupied` slots (all below
  // num_slots); disk files are resized in place. The old mappings are kept (views of them stay
  // readable) but no longer see the pages.
  void remap(std::uint64_t num_slots, std::vector<MemoryPool> memory, const std::vector<std::uint64_t>& occupied);
  StorageStatistics statistics() const { return {allocator.num_slots(), allocator.num_free(), evictable.size()}; }
  double utilization() const;
  // Disk blocks for the slots `arriving` more pages will take (Error(kDiskOOM) if the disk is full).
  void ensure_backed(std::uint64_t arriving);
  // A disk whose file system is full keeps only the slots it has blocks for (every slot in use
  // was written, so backed, and lies below them).
  void shrink_to_backed();
};

class CacheLevel {
 public:
  CacheLevel(int index, const KVCacheManagerConfig& config, const LifeCycleRegistry& registry,
             const StorageConfig& storage);

  int index;
  CacheTier tier;
  bool is_disk() const { return tier == CacheTier::kDisk; }
  SlotCounts counts;
  std::deque<PoolGroup> pool_groups;  // a deque: never moves, pages' queues point into it

  std::vector<StorageStatistics> statistics() const;
  std::uint64_t total_slots() const;
  void close();  // removes the disk files
};

// A level's memory or files that failed (kHostOOM, kDiskOOM, kOS) are marked as raised by
// `level`, unless already marked: called in the handlers around what builds or resizes a level
// (cache_level.py's at_level).
void at_level(Error& error, int level);

}  // namespace kvcore
