// Slot ids of one pool group: recycled slots first (FIFO), then fresh ids 0, 1, 2, ...
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace kvcore {

class SlotAllocator {
 public:
  explicit SlotAllocator(std::uint64_t num_slots) : num_slots_(num_slots) {}

  std::uint64_t num_slots() const { return num_slots_; }
  std::uint64_t num_free() const { return recycled_.size() + num_slots_ - next_fresh_; }
  // n slot ids, all or none (Error kOutOfPages).
  std::vector<std::uint64_t> allocate(std::uint64_t n);
  void release(std::uint64_t slot) { recycled_.push_back(slot); }

 private:
  std::uint64_t num_slots_;
  std::deque<std::uint64_t> recycled_;
  std::uint64_t next_fresh_ = 0;
};

}  // namespace kvcore
