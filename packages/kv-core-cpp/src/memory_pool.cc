#include "kvcore/memory_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <string>

#include "kvcore/error.h"

namespace kvcore {

MemoryPool::MemoryPool(std::uint64_t num_slots, std::uint64_t slot_size)
    : size_(num_slots * slot_size), mapped_(size_ ? size_ : 1), slot_size_(slot_size) {
  // Reserve, don't commit: MAP_NORESERVE takes no commit charge for the whole quota, so a quota
  // beyond RAM maps; a page costs memory once populated or written.
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw Error(ErrorKind::kHostOOM, "cannot map " + std::to_string(mapped_) + " bytes for a pool");
  data_ = static_cast<std::uint8_t*>(p);
}

MemoryPool::~MemoryPool() {
  if (data_) munmap(data_, mapped_);
}

MemoryPool::MemoryPool(MemoryPool&& other) noexcept
    : data_(other.data_),
      size_(other.size_),
      mapped_(other.mapped_),
      slot_size_(other.slot_size_),
      populated_(other.populated_) {
  other.data_ = nullptr;
}

void MemoryPool::populate(std::uint64_t end) {
  end = std::min(size_, (end + kPopulateChunk - 1) / kPopulateChunk * kPopulateChunk);
  if (end <= populated_) return;
#ifdef MADV_POPULATE_WRITE
  // Asked once, whatever the answer: a refused range faults in as it is written.
  madvise(data_ + populated_, end - populated_, MADV_POPULATE_WRITE);
#endif
  populated_ = end;
}

}  // namespace kvcore
