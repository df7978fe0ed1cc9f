// The disk tier's pool: one sparse file per (pool group, pool), pages moved with positioned I/O
// (see disk_pool.py).
#pragma once

#include <cstdint>
#include <string>

namespace kvcore {

class DiskPool {
 public:
  // A new file `kvcore-XXXXXX.pages` in `directory`, sized for the slots (sparse: nothing is
  // allocated until written). Error(kOS) when it cannot be created or sized.
  DiskPool(const std::string& directory, std::uint64_t num_slots, std::uint64_t slot_size);
  ~DiskPool();
  DiskPool(const DiskPool&) = delete;
  DiskPool& operator=(const DiskPool&) = delete;
  DiskPool(DiskPool&& other) noexcept;
  DiskPool& operator=(DiskPool&&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t slot_size() const { return slot_size_; }
  // The file's blocks for slots [0, end) allocated (posix_fallocate up to the high-water mark):
  // Error(kDiskOOM) on ENOSPC/EDQUOT, Error(kOS) otherwise; nothing changes on failure.
  void ensure_backed(std::uint64_t end);
  // n bytes at slot `slot` (runs of contiguous slots in one call); short I/O and EINTR retried.
  void write(std::uint64_t slot, const std::uint8_t* src, std::uint64_t n);
  void read(std::uint64_t slot, std::uint8_t* dst, std::uint64_t n) const;
  // Grow or cut the file to num_slots slots (slots beyond it hold nothing).
  void resize(std::uint64_t num_slots);
  // Close and remove the file (idempotent).
  void close() noexcept;

 private:
  [[noreturn]] void io_error(int error_number) const;

  int fd_ = -1;
  std::string directory_;
  std::string path_;
  std::uint64_t size_ = 0;
  std::uint64_t slot_size_ = 0;
  std::uint64_t backed_ = 0;  // slots whose blocks are allocated
};

}  // namespace kvcore
