// The ghost record (docs/manager.md, "Why a prompt missed"; mirrors ghost_record.py): the keys of
// the last full blocks that left the tree, each with the cache level it was dropped from and
// when, so that a prompt's missed block can be told apart as evicted rather than never seen.
//
// At most `capacity` keys, oldest forgotten first. Time is counted in caches created (tick()): an
// entry's age is how many were created since it was recorded. No lock of its own: the tree's
// (REQUIRES: the manager's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kvcore/huge_pages.h"
#include "kvcore/radix_tree.h"
#include "kvcore/sha256.h"

namespace kvcore {

// A recorded block: the level it was dropped from and its age (kv_api.stats.EvictedBlock).
struct EvictedBlock {
  int level;
  std::int64_t age;
};

class GhostRecord {
 public:
  explicit GhostRecord(std::int64_t capacity) : capacity_(capacity) {}
  GhostRecord(const GhostRecord&) = delete;
  GhostRecord& operator=(const GhostRecord&) = delete;

  std::size_t size() const noexcept { return live_; }
  std::int64_t clock() const noexcept { return clock_; }
  void tick() noexcept { ++clock_; }  // a cache was created
  // A full block left the tree, dropped from `level`; a key recorded again becomes the newest.
  void record(const Digest& key, int level);
  void forget(const Digest& key) noexcept;  // the block is back in the tree
  std::optional<EvictedBlock> find(const Digest& key) const;
  // Asks for the index line a later call with `key` reads: the index is far larger than the
  // caches, and a commit, an eviction or a report knows its next keys some blocks ahead.
  void prefetch(const std::uint8_t* key) const noexcept;  // its 32 bytes

 private:
  // The record as a flat log and an open-addressing index into it (a node-based map cost two or
  // three cache misses an operation, the record sees one an evicted and one a committed block):
  // entries in record order from head_, a forgotten one left dead until a compaction drops it;
  // slots probed linearly, each the low 32 bits of its key's first word (where it belongs, and a
  // cheap first test) and its entry's position + 1 (0: empty).
  struct Entry {
    Digest key;
    std::int64_t clock;
    int level;
    bool live;
  };
  struct Slot {
    std::uint32_t tag;
    std::uint32_t pos;
  };
  using Index = std::vector<Slot, HugeAllocator<Slot>>;  // read at random: huge pages
  static constexpr std::size_t kNone = ~std::size_t{0};
  static constexpr std::size_t kForgetAhead = 8;  // entries: how far ahead a full record prefetches
  // Entries the log's first growth makes room for at most (below that, all it can hold: the
  // capacity, half as many dead, and the slack before a compaction).
  static constexpr std::size_t kFirstRoom = std::size_t{6} << 20;

  std::size_t locate(const Digest& key) const noexcept;  // the slot holding key, or kNone
  static void put(Index& slots, Slot slot) noexcept;     // at its home or the next free slot
  void place(std::size_t pos) noexcept;                  // indexes entry pos (a slot is free)
  void erase_slot(std::size_t slot) noexcept;
  void grow();              // the index doubled (what may throw)
  void grow_log();          // room for more entries (what may throw)
  void reindex() noexcept;  // every live entry placed afresh
  void compact() noexcept;  // dead and popped entries dropped

  std::int64_t capacity_;
  std::int64_t clock_ = 0;  // caches created so far
  std::vector<Entry, HugeAllocator<Entry>> log_;
  std::size_t head_ = 0;  // the oldest entry not popped
  std::size_t live_ = 0;
  Index slots_;  // a power of two, at most half full
};

}  // namespace kvcore
