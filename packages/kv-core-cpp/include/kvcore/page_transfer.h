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
#include <utility>
#include <vector>

#include "kvcore/cache_level.h"

namespace kvcore {

// (src_address, dst_address, num_bytes): one contiguous range of page bytes.
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

class PageTransfer {
 public:
  explicit PageTransfer(PageCopier* copier) : copier_(copier) {}  // nullptr: memmove

  // Copies every pool of pool group `pool_group` from `src`'s slots to `dst`'s: all of it, or it
  // throws (the copier's error, Error(kDiskOOM) or Error(kOS)) and the destination slots hold
  // whatever was written. Counts the bytes once all are copied. The source slots (in move order)
  // whose bytes read from disk failed their checksum in some pool; within the disk tier their
  // copies fail it too.
  std::vector<std::uint64_t> copy(CacheLevel& src, CacheLevel& dst, int pool_group, const SlotMoves& moves);
  // Per (src_level, dst_level), in the order each direction first moved bytes (a Python dict's).
  const std::vector<std::pair<std::pair<int, int>, std::uint64_t>>& bytes_moved() const { return bytes_; }

 private:
  PageCopier* copier_;
  std::vector<std::pair<std::pair<int, int>, std::uint64_t>> bytes_;
};

}  // namespace kvcore
