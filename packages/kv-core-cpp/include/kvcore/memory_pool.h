// Real memory behind a pool: reserved address space, committed page by page as it is written;
// mirrors memory_pool.py.
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

 private:
  std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t mapped_ = 0;
  std::uint64_t slot_size_ = 0;
};

}  // namespace kvcore
