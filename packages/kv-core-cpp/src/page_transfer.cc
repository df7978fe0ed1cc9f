#include "kvcore/page_transfer.h"

#include <algorithm>
#include <cstring>

namespace kvcore {

namespace {

// Slot ranges: (first source slot, first destination slot, number of slots), contiguous pairs merged.
void slot_runs(const SlotMoves& moves, std::vector<SlotRun>& runs) {
  for (const auto& [s, d] : moves) {
    if (!runs.empty()) {
      SlotRun& last = runs.back();
      if (last.src + last.count == s && last.dst + last.count == d) {
        ++last.count;
        continue;
      }
    }
    runs.push_back({s, d, 1});
  }
}

std::uint64_t slot_bytes(const PoolGroup& group) {
  std::uint64_t total = 0;
  for (std::uint64_t size : group.slot_sizes) total += size;
  return total;
}

}  // namespace

void PageTransfer::count(int src_level, int dst_level, std::uint64_t num_bytes) {
  const std::pair<int, int> key{src_level, dst_level};
  auto it = std::find_if(bytes_.begin(), bytes_.end(), [&](const auto& entry) { return entry.first == key; });
  if (it == bytes_.end()) {
    bytes_.emplace_back(key, num_bytes);
  } else {
    it->second += num_bytes;
  }
}

void PageTransfer::copy_runs(int src_level, int dst_level, const std::vector<CopyRun>& runs) {
  if (copier_ != nullptr) {
    copier_->copy(src_level, dst_level, runs);
    return;
  }
  for (const CopyRun& c : runs) {
    std::memmove(reinterpret_cast<void*>(c.dst), reinterpret_cast<const void*>(c.src), c.num_bytes);
  }
}

std::vector<std::size_t> PageTransfer::export_pages(const std::vector<ExportPage>& pages, std::uint8_t* buffer) {
  const int remote = remote_level();
  std::vector<std::size_t> bad;
  std::vector<std::vector<CopyRun>> runs(levels_.size());  // per memory level
  std::vector<std::uint64_t> corrupt;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const ExportPage& page = pages[i];
    PoolGroup& group = levels_[page.level]->pool_groups[page.pool_group];
    std::uint64_t offset = page.offset;
    for (std::size_t p = 0; p < group.disk_pools.size(); ++p) {
      corrupt.clear();
      group.disk_pools[p].read(page.slot, buffer + offset, group.slot_sizes[p], corrupt);
      if (!corrupt.empty() && (bad.empty() || bad.back() != i)) bad.push_back(i);
      offset += group.slot_sizes[p];
    }
    for (std::size_t p = 0; p < group.pools.size(); ++p) {
      const std::uint64_t size = group.slot_sizes[p];
      runs[page.level].push_back({reinterpret_cast<std::uintptr_t>(group.pools[p].data() + page.slot * size),
                                  reinterpret_cast<std::uintptr_t>(buffer + offset), size});
      offset += size;
    }
  }
  for (std::size_t level = 0; level < runs.size(); ++level) {
    if (!runs[level].empty()) copy_runs(static_cast<int>(level), remote, runs[level]);
  }
  for (const ExportPage& page : pages) {
    count(page.level, remote, slot_bytes(levels_[page.level]->pool_groups[page.pool_group]));
  }
  return bad;
}

void PageTransfer::import_pages(int level, const std::vector<ImportPage>& pages, const std::uint8_t* buffer) {
  std::vector<CopyRun> runs;
  for (const ImportPage& page : pages) {
    PoolGroup& group = levels_[level]->pool_groups[page.pool_group];
    std::uint64_t offset = page.offset;
    for (std::size_t p = 0; p < group.disk_pools.size(); ++p) {
      group.disk_pools[p].ensure_backed(page.slot + 1);
      group.disk_pools[p].write(page.slot, buffer + offset, group.slot_sizes[p]);
      offset += group.slot_sizes[p];
    }
    group.populate(page.slot + 1);
    for (std::size_t p = 0; p < group.pools.size(); ++p) {
      const std::uint64_t size = group.slot_sizes[p];
      runs.push_back({reinterpret_cast<std::uintptr_t>(buffer + offset),
                      reinterpret_cast<std::uintptr_t>(group.pools[p].data() + page.slot * size), size});
      offset += size;
    }
  }
  const int remote = remote_level();
  if (!runs.empty()) copy_runs(remote, level, runs);
  for (const ImportPage& page : pages) count(remote, level, slot_bytes(levels_[level]->pool_groups[page.pool_group]));
}

std::vector<std::uint64_t> PageTransfer::copy(CacheLevel& src, CacheLevel& dst, int pool_group,
                                              const SlotMoves& moves) {
  if (moves.empty()) return {};
  Borrowed<SlotRun> runs_list(runs_);
  const std::vector<SlotRun>& runs = *runs_list;
  slot_runs(moves, *runs_list);
  PoolGroup& from = src.pool_groups[pool_group];
  PoolGroup& to = dst.pool_groups[pool_group];
  std::uint64_t bytes = 0;
  std::vector<std::uint64_t> bad;
  std::uint64_t end = 0;
  for (const SlotRun& r : runs) end = std::max(end, r.dst + r.count);
  to.populate(end);                      // a disk level has no memory pools
  if (src.is_disk() && dst.is_disk()) {  // within the disk tier (a quota resize's defragmentation)
    for (std::size_t p = 0; p < from.disk_pools.size(); ++p) {
      DiskPool& disk = from.disk_pools[p];
      const std::uint64_t size = from.slot_sizes[p];
      for (const SlotRun& r : runs) {
        std::vector<std::uint8_t> buf(r.count * size);
        const std::size_t first = bad.size();
        disk.read(r.src, buf.data(), buf.size(), bad);
        disk.ensure_backed(r.dst + r.count);
        disk.write(r.dst, buf.data(), buf.size());
        for (std::size_t i = first; i < bad.size(); ++i) disk.forget(r.dst + bad[i] - r.src);  // still no page
        bytes += r.count * size;
      }
    }
  } else if (dst.is_disk()) {
    for (std::size_t p = 0; p < to.disk_pools.size(); ++p) {
      const std::uint64_t size = to.slot_sizes[p];
      for (const SlotRun& r : runs) {
        to.disk_pools[p].ensure_backed(r.dst + r.count);
        to.disk_pools[p].write(r.dst, from.pools[p].data() + r.src * size, r.count * size);
        bytes += r.count * size;
      }
    }
  } else if (src.is_disk()) {
    for (std::size_t p = 0; p < from.disk_pools.size(); ++p) {
      const std::uint64_t size = from.slot_sizes[p];
      for (const SlotRun& r : runs) {
        from.disk_pools[p].read(r.src, to.pools[p].data() + r.dst * size, r.count * size, bad);
        bytes += r.count * size;
      }
    }
  } else {
    Borrowed<CopyRun> copies_list(copies_);
    std::vector<CopyRun>& copies = *copies_list;
    for (std::size_t p = 0; p < from.pools.size(); ++p) {
      const std::uint64_t size = from.slot_sizes[p];
      for (const SlotRun& r : runs) {
        copies.push_back({reinterpret_cast<std::uintptr_t>(from.pools[p].data() + r.src * size),
                          reinterpret_cast<std::uintptr_t>(to.pools[p].data() + r.dst * size), r.count * size});
        bytes += r.count * size;
      }
    }
    copy_runs(src.index, dst.index, copies);
  }
  count(src.index, dst.index, bytes);
  if (bad.empty()) return bad;
  std::vector<std::uint64_t> out;  // the source slots in move order, each once
  for (const auto& m : moves) {
    if (std::find(bad.begin(), bad.end(), m.first) != bad.end()) out.push_back(m.first);
  }
  return out;
}

}  // namespace kvcore
