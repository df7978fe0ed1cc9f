#include "kvcore/disk_pool.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kvcore/error.h"

namespace kvcore {

namespace {}  // namespace

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
  std::string name = directory + "/kvcore-XXXXXX.pages";
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  fd_ = mkstemps(buf.data(), 6);  // ".pages"
  if (fd_ < 0) io_error(errno);
  path_.assign(buf.data());
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
      path_(std::move(other.path_)),
      size_(other.size_),
      slot_size_(other.slot_size_),
      backed_(other.backed_) {
  other.fd_ = -1;
  other.path_.clear();
}

void DiskPool::close() noexcept {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  unlink(path_.c_str());
}

void DiskPool::resize(std::uint64_t num_slots) {
  if (ftruncate(fd_, static_cast<off_t>(num_slots * slot_size_)) != 0) io_error(errno);
  size_ = num_slots * slot_size_;
  backed_ = std::min(backed_, num_slots);
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
}

void DiskPool::write(std::uint64_t slot, const std::uint8_t* src, std::uint64_t n) {
  auto offset = static_cast<off_t>(slot * slot_size_);
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

void DiskPool::read(std::uint64_t slot, std::uint8_t* dst, std::uint64_t n) const {
  auto offset = static_cast<off_t>(slot * slot_size_);
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
