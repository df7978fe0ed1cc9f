#include "kvcore/slot_allocator.h"

#include <algorithm>
#include <string>

#include "kvcore/error.h"

namespace kvcore {

std::vector<std::uint64_t> SlotAllocator::allocate(std::uint64_t n) {
  std::vector<std::uint64_t> taken;
  taken.reserve(n);
  allocate(n, taken);
  return taken;
}

void SlotAllocator::allocate(std::uint64_t n, std::vector<std::uint64_t>& out) {
  if (n > num_free()) {
    throw Error(ErrorKind::kOutOfPages,
                "need " + std::to_string(n) + " slots, " + std::to_string(num_free()) + " free");
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    if (!recycled_.empty()) {
      out.push_back(recycled_.front());
      recycled_.pop_front();
    } else {
      out.push_back(next_fresh_++);
    }
  }
  peak_ = std::max(peak_, num_slots_ - num_free());
}

std::uint64_t SlotAllocator::take_peak() {
  const std::uint64_t peak = peak_;
  peak_ = num_slots_ - num_free();
  return peak;
}

std::vector<std::uint64_t> SlotAllocator::peek(std::uint64_t n, std::optional<std::uint64_t> below) const {
  std::vector<std::uint64_t> taken;
  taken.reserve(n);
  peek(n, below, taken);
  return taken;
}

void SlotAllocator::peek(std::uint64_t n, std::optional<std::uint64_t> below, std::vector<std::uint64_t>& out) const {
  const std::uint64_t limit = below.value_or(num_slots_);
  out.clear();
  for (auto it = recycled_.begin(); out.size() < n && it != recycled_.end(); ++it) {
    if (*it < limit) out.push_back(*it);
  }
  for (std::uint64_t fresh = std::min(next_fresh_, limit); out.size() < n; ++fresh) out.push_back(fresh);
}

void SlotAllocator::resize(std::uint64_t num_slots) {
  if (num_slots < num_slots_) {
    std::deque<std::uint64_t> kept;
    for (std::uint64_t s : recycled_) {
      if (s < num_slots) kept.push_back(s);
    }
    recycled_.swap(kept);
    next_fresh_ = std::min(next_fresh_, num_slots);
  }
  num_slots_ = num_slots;
}

}  // namespace kvcore
