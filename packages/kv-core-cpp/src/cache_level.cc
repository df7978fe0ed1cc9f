#include "kvcore/cache_level.h"

#include <algorithm>
#include <cstring>

namespace kvcore {

PoolGroup::PoolGroup(int index, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t num_slots,
                     const std::string* disk_directory, bool populating)
    : index(index), populating(populating), allocator(num_slots), slot_sizes(slot_sizes) {
  if (disk_directory != nullptr) {
    disk_pools.reserve(slot_sizes.size());
    for (std::uint64_t size : slot_sizes) disk_pools.emplace_back(*disk_directory, num_slots, size);
  } else {
    pools.reserve(slot_sizes.size());
    for (std::uint64_t size : slot_sizes) pools.emplace_back(num_slots, size);
  }
}

std::vector<std::uint64_t> PoolGroup::allocate(std::uint64_t n) {
  std::vector<std::uint64_t> slots;
  allocate(n, slots);
  return slots;
}

void PoolGroup::allocate(std::uint64_t n, std::vector<std::uint64_t>& out) {
  allocator.allocate(n, out);
  populate(allocator.next_fresh());
}

void PoolGroup::populate(std::uint64_t end) {
  if (!populating) return;
  for (MemoryPool& pool : pools) pool.populate(end * pool.slot_size());
}

std::vector<MemoryPool> PoolGroup::new_memory(std::uint64_t num_slots) const {
  std::vector<MemoryPool> out;
  out.reserve(pools.size());
  for (const MemoryPool& pool : pools) out.emplace_back(num_slots, pool.slot_size());
  return out;
}

void PoolGroup::remap(std::uint64_t num_slots, std::vector<MemoryPool> memory,
                      const std::vector<std::uint64_t>& occupied) {
  for (std::size_t p = 0; p < pools.size() && p < memory.size(); ++p) {
    const std::uint64_t size = pools[p].slot_size();
    if (populating) memory[p].populate(std::min(allocator.next_fresh(), num_slots) * size);
    for (std::uint64_t s : occupied) std::memcpy(memory[p].data() + s * size, pools[p].data() + s * size, size);
  }
  if (!pools.empty()) {
    for (MemoryPool& old : pools) retired_pools.push_back(std::move(old));
    pools = std::move(memory);
  }
  for (DiskPool& pool : disk_pools) pool.resize(num_slots);
}

double PoolGroup::utilization() const {
  const StorageStatistics s = statistics();
  if (s.total == 0) return 0.0;
  return static_cast<double>(s.total - s.free - s.evictable) / static_cast<double>(s.total);
}

void PoolGroup::ensure_backed(std::uint64_t arriving) {
  // Pages beyond the free slots take slots that drops free first: written before, so backed.
  const std::vector<std::uint64_t> slots = allocator.peek(std::min(arriving, allocator.num_free()));
  const std::uint64_t upto = slots.empty() ? 0 : *std::max_element(slots.begin(), slots.end()) + 1;
  for (DiskPool& pool : disk_pools) pool.ensure_backed(upto);
}

void PoolGroup::shrink_to_backed() {
  std::uint64_t backed = allocator.num_slots();
  for (const DiskPool& pool : disk_pools) backed = std::min(backed, pool.backed());
  allocator.resize(backed);
}

void at_level(Error& error, int level) {
  const ErrorKind kind = error.kind();
  const bool of_a_level = kind == ErrorKind::kHostOOM || kind == ErrorKind::kDiskOOM || kind == ErrorKind::kOS;
  if (of_a_level && !error.level()) error.set_level(level);
}

CacheLevel::CacheLevel(int index, const KVCacheManagerConfig& config, const LifeCycleRegistry& registry,
                       const StorageConfig& storage) try
    : index(index), tier(config.cache_tiers.at(index).tier), counts(config, registry, storage, index) {
  const std::string* directory = is_disk() ? &config.cache_tiers[index].path : nullptr;
  for (const PoolGroupConfig& pg : storage.pool_groups())
    pool_groups.emplace_back(pg.index, pg.slot_sizes, counts.slots[pg.index], directory, config.populate_memory);
} catch (Error& e) {  // rethrown at the handler's end, as a constructor's always is
  at_level(e, index);
}

std::vector<StorageStatistics> CacheLevel::statistics() const {
  std::vector<StorageStatistics> out;
  for (const PoolGroup& pg : pool_groups) out.push_back(pg.statistics());
  return out;
}

std::uint64_t CacheLevel::total_slots() const {
  std::uint64_t total = 0;
  for (const PoolGroup& pg : pool_groups) total += pg.num_slots();
  return total;
}

void CacheLevel::close() {
  for (PoolGroup& pg : pool_groups) {
    for (DiskPool& d : pg.disk_pools) d.close();
  }
}

}  // namespace kvcore
