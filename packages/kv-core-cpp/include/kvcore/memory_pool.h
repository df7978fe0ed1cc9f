// Real memory behind a pool: reserved address space, committed as the pool group's slots are
// first handed out (populate) rather than page by page as the engine or a copy first writes
// them; mirrors memory_pool.py.
//
// The pool owns its mapping, unmapped by the destructor (a moved-from pool owns none): data() is
// valid and fixed for the pool's life, and untouched bytes read as zeros. No lock of its own: it
// is its pool group's, used under the manager's lock (the thread rule: docs/architecture.md,
// Threads).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore {

class MemoryPool {
 public:
  MemoryPool(std::uint64_t num_slots, std::uint64_t slot_size);  // Error(kHostOOM) if mapping fails
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;
  MemoryPool(MemoryPool&& other) noexcept;
  MemoryPool& operator=(MemoryPool&&) = delete;

  std::uint8_t* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t slot_size() const { return slot_size_; }
  // Commits the bytes below `end` (rounded up to kPopulateChunk) not committed yet, in one call
  // (MADV_POPULATE_WRITE, which leaves every byte's value as it is), so the copies and writes
  // into them run at memory speed rather than taking a fault per page. Advisory: where the
  // kernel lacks it (before Linux 5.14) or refuses, the bytes fault in as they are written.
  void populate(std::uint64_t end);
  std::uint64_t populated() const { return populated_; }

 private:
  std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t mapped_ = 0;
  std::uint64_t slot_size_ = 0;
  std::uint64_t populated_ = 0;  // bytes below are committed
};

// A huge page's size: a populate call covers whole ones, so small slots cost a call per 2 MiB.
inline constexpr std::uint64_t kPopulateChunk = std::uint64_t{2} << 20;

}  // namespace kvcore
