// Slot ids of one pool group: recycled slots first (FIFO), then fresh ids 0, 1, 2, ...; mirrors
// slot_allocator.py.
//
// Part of one PoolGroup (one CacheLevel's). It counts ids only: which page has a slot is the
// page record's (Storage's), and release() trusts its caller to give back an id it handed out,
// once. Every member REQUIRES: the manager's lock (the thread rule: docs/architecture.md,
// Threads).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace kvcore {

class SlotAllocator {
 public:
  explicit SlotAllocator(std::uint64_t num_slots) : num_slots_(num_slots) {}

  std::uint64_t num_slots() const { return num_slots_; }
  std::uint64_t num_free() const { return recycled_.size() + num_slots_ - next_fresh_; }
  // n slot ids, all or none (Error kOutOfPages).
  std::vector<std::uint64_t> allocate(std::uint64_t n);
  // The same, appended to `out` (a caller's vector reused: no allocation once it has grown).
  void allocate(std::uint64_t n, std::vector<std::uint64_t>& out);
  void release(std::uint64_t slot) { recycled_.push_back(slot); }
  // Every id handed out since the last shrink is below it.
  std::uint64_t next_fresh() const { return next_fresh_; }
  // The ids allocate(n) would hand out now (after resize(below)), without taking them.
  std::vector<std::uint64_t> peek(std::uint64_t n, std::optional<std::uint64_t> below = std::nullopt) const;
  void peek(std::uint64_t n, std::optional<std::uint64_t> below, std::vector<std::uint64_t>& out) const;  // into `out`
  // Hand out ids below num_slots from now on; every id at or above it must be free.
  void resize(std::uint64_t num_slots);
  // The most slots in use at once since the last call; then counts from those in use now.
  std::uint64_t take_peak();

 private:
  std::uint64_t num_slots_;
  std::deque<std::uint64_t> recycled_;
  std::uint64_t next_fresh_ = 0;
  std::uint64_t peak_ = 0;  // the most slots in use at once since take_peak()
};

}  // namespace kvcore
