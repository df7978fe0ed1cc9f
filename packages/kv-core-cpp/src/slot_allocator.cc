#include "kvcore/slot_allocator.h"

#include <string>

#include "kvcore/error.h"

namespace kvcore {

std::vector<std::uint64_t> SlotAllocator::allocate(std::uint64_t n) {
  if (n > num_free()) {
    throw Error(ErrorKind::kOutOfPages,
                "need " + std::to_string(n) + " slots, " + std::to_string(num_free()) + " free");
  }
  std::vector<std::uint64_t> taken;
  taken.reserve(n);
  while (taken.size() < n && !recycled_.empty()) {
    taken.push_back(recycled_.front());
    recycled_.pop_front();
  }
  while (taken.size() < n) taken.push_back(next_fresh_++);
  return taken;
}

}  // namespace kvcore
