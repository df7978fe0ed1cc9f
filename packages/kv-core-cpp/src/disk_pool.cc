#include "kvcore/disk_pool.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kvcore/checksum.h"
#include "kvcore/error.h"

namespace kvcore {

namespace {

// A new file in `directory` that no name points to (see disk_pool.py's open_unlinked).
int open_unlinked(const std::string& directory) {
  int fd = open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  std::string name = directory + "/kvcore-XXXXXX.pages";
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  fd = mkostemps(buf.data(), 6, O_CLOEXEC);  // ".pages"
  if (fd < 0) return fd;
  if (unlink(buf.data()) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

}  // namespace

// disk_pool.py's io_error: DiskOOMError for a full disk, else OSError naming the tier.
void DiskPool::io_error(int error_number) const {
  if (error_number == 0) error_number = EIO;
  if (error_number == ENOSPC || error_number == EDQUOT)
    throw Error(ErrorKind::kDiskOOM, "disk tier: no space left in " + directory_, error_number);
  throw Error(ErrorKind::kOS, std::string("disk tier: ") + std::strerror(error_number) + " in " + directory_,
              error_number);
}

DiskPool::DiskPool(const std::string& directory, std::uint64_t num_slots, std::uint64_t slot_size)
    : directory_(directory), size_(num_slots * slot_size), slot_size_(slot_size) {
  fd_ = open_unlinked(directory);
  if (fd_ < 0) io_error(errno);
  if (ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
    const int e = errno;
    close();
    io_error(e);
  }
}

DiskPool::~DiskPool() { close(); }

DiskPool::DiskPool(DiskPool&& other) noexcept
    : fd_(other.fd_),
      directory_(std::move(other.directory_)),
      sums_(std::move(other.sums_)),
      size_(other.size_),
      slot_size_(other.slot_size_),
      backed_(other.backed_) {
  other.fd_ = -1;
}

void DiskPool::close() noexcept {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
}

void DiskPool::resize(std::uint64_t num_slots) {
  if (ftruncate(fd_, static_cast<off_t>(num_slots * slot_size_)) != 0) io_error(errno);
  size_ = num_slots * slot_size_;
  backed_ = std::min(backed_, num_slots);
  if (sums_.size() > num_slots) sums_.resize(num_slots);
}

void DiskPool::ensure_backed(std::uint64_t end) {
  if (end <= backed_) return;
  int e;
  do {
    e = posix_fallocate(fd_, static_cast<off_t>(backed_ * slot_size_),
                        static_cast<off_t>((end - backed_) * slot_size_));
  } while (e == EINTR);
  // A file system without fallocate: blocks are allocated as written (as disk_pool.py).
  if (e != 0 && e != EOPNOTSUPP && e != EINVAL) io_error(e);
  backed_ = end;
  sums_.resize(end, kUnwritten);  // the table grows with the slots in use, not the quota
}

std::uint64_t DiskPool::chunk_bytes() const {
  return std::max<std::uint64_t>(1, kChunkBytes / slot_size_) * slot_size_;
}

void DiskPool::write(std::uint64_t slot, const std::uint8_t* src, std::uint64_t n) {
  const std::uint64_t count = n / slot_size_;
  if (sums_.size() < slot + count) sums_.resize(slot + count, kUnwritten);
  std::fill_n(sums_.begin() + static_cast<std::ptrdiff_t>(slot), count, kUnwritten);
  std::vector<std::uint64_t> sums(count);
  const std::uint64_t chunk = chunk_bytes();
  for (std::uint64_t at = 0; at < n; at += chunk) {
    const std::uint64_t len = std::min(chunk, n - at);
    for (std::uint64_t b = at; b < at + len; b += slot_size_) sums[b / slot_size_] = page_checksum(src + b, slot_size_);
    write_all(src + at, len, static_cast<off_t>(slot * slot_size_ + at));  // the chunk still in cache
  }
  std::copy(sums.begin(), sums.end(), sums_.begin() + static_cast<std::ptrdiff_t>(slot));
}

void DiskPool::read(std::uint64_t slot, std::uint8_t* dst, std::uint64_t n, std::vector<std::uint64_t>& corrupt) const {
  const std::uint64_t chunk = chunk_bytes();
  for (std::uint64_t at = 0; at < n; at += chunk) {
    const std::uint64_t len = std::min(chunk, n - at);
    read_all(dst + at, len, static_cast<off_t>(slot * slot_size_ + at));
    for (std::uint64_t b = at; b < at + len; b += slot_size_) {  // checked while still in cache
      const std::uint64_t s = slot + b / slot_size_;
      if (s >= sums_.size() || page_checksum(dst + b, slot_size_) != sums_[s]) corrupt.push_back(s);
    }
  }
}

void DiskPool::write_all(const std::uint8_t* src, std::uint64_t n, off_t offset) {
  while (n) {
    const ssize_t done = pwrite(fd_, src, n, offset);
    if (done < 0) {
      if (errno == EINTR) continue;
      io_error(errno);
    }
    src += done;
    offset += done;
    n -= static_cast<std::uint64_t>(done);
  }
}

void DiskPool::read_all(std::uint8_t* dst, std::uint64_t n, off_t offset) const {
  while (n) {
    const ssize_t done = pread(fd_, dst, n, offset);
    if (done < 0) {
      if (errno == EINTR) continue;
      io_error(errno);
    }
    if (done == 0) {  // beyond the end: the file was truncated under us
      throw Error(ErrorKind::kOS, "disk tier: unexpected end of file in " + directory_, EIO);
    }
    dst += done;
    offset += done;
    n -= static_cast<std::uint64_t>(done);
  }
}

}  // namespace kvcore
