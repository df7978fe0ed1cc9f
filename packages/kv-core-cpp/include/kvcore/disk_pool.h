// The disk tier's pool: one sparse, unlinked file per (pool group, pool), pages moved with
// positioned I/O, each slot checked against the checksum (CRC-32C) of what was written there
// (docs/manager.md, "Eviction and tiers"; mirrors disk_pool.py).
//
// Guarantees: a read reports every slot whose bytes do not match what was last written there; a
// slot never written, cut off by a resize or forgotten counts as corrupt. The pool owns its
// file descriptor, closed by close() or the destructor (a moved-from pool owns none). No lock of
// its own: it is its pool group's, so every member REQUIRES: the manager's lock (the thread rule:
// docs/architecture.md, Threads).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvcore {

class DiskPool {
 public:
  // A new file in `directory` that no name points to (O_TMPFILE, else `kvcore-XXXXXX.pages`
  // removed at once), so the kernel frees it however the process ends; sized for the slots
  // (sparse: nothing is allocated until written). Error(kOS) when it cannot be created or sized.
  DiskPool(const std::string& directory, std::uint64_t num_slots, std::uint64_t slot_size);
  ~DiskPool();
  DiskPool(const DiskPool&) = delete;
  DiskPool& operator=(const DiskPool&) = delete;
  DiskPool(DiskPool&& other) noexcept;
  DiskPool& operator=(DiskPool&&) = delete;

  std::uint64_t size() const { return size_; }
  std::uint64_t slot_size() const { return slot_size_; }
  std::uint64_t backed() const { return backed_; }  // slots below this have their blocks allocated
  const std::string& directory() const { return directory_; }
  // The file's blocks for slots [0, end) allocated (posix_fallocate up to the high-water mark):
  // Error(kDiskOOM) on ENOSPC/EDQUOT, Error(kOS) otherwise; nothing changes on failure.
  void ensure_backed(std::uint64_t end);
  // n bytes (whole slots) at slot `slot` (runs of contiguous slots in calls of about
  // kChunkBytes); short I/O and EINTR retried. A write notes each slot's checksum (a failed one leaves its slots
  // unwritten); a read appends to `corrupt` the slots whose bytes do not match theirs.
  void write(std::uint64_t slot, const std::uint8_t* src, std::uint64_t n);
  void read(std::uint64_t slot, std::uint8_t* dst, std::uint64_t n, std::vector<std::uint64_t>& corrupt) const;
  // `slot` holds no page that can be read back (a corrupt page copied into it).
  void forget(std::uint64_t slot) {
    if (slot < sums_.size()) sums_[slot] = kUnwritten;
  }
  // Grow or cut the file to num_slots slots (slots beyond it hold nothing).
  void resize(std::uint64_t num_slots);
  // Close the file, which frees it (idempotent).
  void close() noexcept;

 private:
  [[noreturn]] void io_error(int error_number) const;
  // Bytes moved per system call: whole slots, about kChunkBytes, so a slot is checksummed while
  // the cache still holds what the call copied (checking costs next to nothing then).
  std::uint64_t chunk_bytes() const;
  void write_all(const std::uint8_t* src, std::uint64_t n, off_t offset);
  void read_all(std::uint8_t* dst, std::uint64_t n, off_t offset) const;

  static constexpr std::uint64_t kChunkBytes = 512 * 1024;

  // The checksum of a slot never written (or cut off by a resize): no page matches it.
  static constexpr std::uint64_t kUnwritten = ~std::uint64_t{0};

  int fd_ = -1;
  std::string directory_;
  std::vector<std::uint64_t> sums_;  // per slot below the high-water mark: the checksum of what was written there
  std::uint64_t size_ = 0;
  std::uint64_t slot_size_ = 0;
  std::uint64_t backed_ = 0;  // slots whose blocks are allocated
};

}  // namespace kvcore
