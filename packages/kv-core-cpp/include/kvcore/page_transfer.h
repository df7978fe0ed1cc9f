// How page bytes move between cache levels (mirrors page_transfer.py): between memory tiers
// through a PageCopier (the default copies host memory), to and from the disk tier by positioned
// I/O straight from or into the other level's memory. Contiguous slots go in one run.
//
// Owned by Storage; it borrows the copier, which the manager's caller keeps alive. Every member
// REQUIRES: the manager's lock, so the copier is called with that lock held, on the thread of the
// manager call that moves the pages (the binding's Python copier takes the GIL for the call). The
// thread rule: docs/architecture.md, Threads.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kvcore/cache_level.h"
#include "kvcore/kept_list.h"

namespace kvcore {

// (src_address, dst_address, num_bytes): one contiguous range of page bytes.
// Consecutive slots moving to consecutive slots.
struct SlotRun {
  std::uint64_t src;
  std::uint64_t dst;
  std::uint64_t count;
};

struct CopyRun {
  std::uintptr_t src = 0;
  std::uintptr_t dst = 0;
  std::uint64_t num_bytes = 0;
};

// kv_api.PageCopier: copies each run (runs never overlap); throwing aborts the move.
class PageCopier {
 public:
  virtual ~PageCopier() = default;
  virtual void copy(int src_level, int dst_level, const std::vector<CopyRun>& runs) = 0;
};

// Slot pairs (source slot, destination slot) of one pool group.
using SlotMoves = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

// A page copied out to a remote value's buffer: (level, pool group, slot) to `offset`.
struct ExportPage {
  int level = 0;
  int pool_group = 0;
  std::uint64_t slot = 0;
  std::uint64_t offset = 0;
};

// A remote value's page copied in: `offset` of the buffer to (pool group, slot) of one level.
struct ImportPage {
  int pool_group = 0;
  std::uint64_t slot = 0;
  std::uint64_t offset = 0;
};

using CacheLevels = std::vector<std::unique_ptr<CacheLevel>>;

class PageTransfer {
 public:
  // `levels`: Storage's, which outlive it. `copier` nullptr: memmove.
  PageTransfer(const CacheLevels& levels, PageCopier* copier) : levels_(levels), copier_(copier) {}

  // The remote tier's level (its values' host memory in copier calls): after the last local one.
  int remote_level() const { return static_cast<int>(levels_.size()); }
  // Copies `pages` into `buffer` at their offsets, pool by pool: one copier call per memory
  // level (ascending, runs in page order), positioned reads from disk. The indices of pages read
  // from disk whose bytes failed their checksum.
  std::vector<std::size_t> export_pages(const std::vector<ExportPage>& pages, std::uint8_t* buffer);
  // Copies `buffer` at each page's offset into its slot of `level`, pool by pool: one copier call
  // for a memory level, positioned writes (blocks allocated first) for disk, which may throw
  // Error(kDiskOOM) or Error(kOS).
  void import_pages(int level, const std::vector<ImportPage>& pages, const std::uint8_t* buffer);

  // Copies every pool of pool group `pool_group` from `src`'s slots to `dst`'s: all of it, or it
  // throws (the copier's error, Error(kDiskOOM) or Error(kOS)) and the destination slots hold
  // whatever was written. Counts the bytes once all are copied. The source slots (in move order)
  // whose bytes read from disk failed their checksum in some pool; within the disk tier their
  // copies fail it too.
  std::vector<std::uint64_t> copy(CacheLevel& src, CacheLevel& dst, int pool_group, const SlotMoves& moves);
  // Per (src_level, dst_level), in the order each direction first moved bytes (a Python dict's).
  const std::vector<std::pair<std::pair<int, int>, std::uint64_t>>& bytes_moved() const { return bytes_; }

 private:
  void count(int src_level, int dst_level, std::uint64_t num_bytes);
  void copy_runs(int src_level, int dst_level, const std::vector<CopyRun>& runs);

  const CacheLevels& levels_;
  PageCopier* copier_;
  std::vector<std::pair<std::pair<int, int>, std::uint64_t>> bytes_;
  KeptList<SlotRun> runs_;  // copy's (kept_list.h: a move down allocates nothing)
  KeptList<CopyRun> copies_;
};

}  // namespace kvcore
