// Memory advised as transparent huge pages, for what is read at random over many megabytes (the
// tree's block arena, the ghost record's index and log): with 4 KiB pages nearly every such read
// also missed the TLB, and a prefetch of such an address waited on the page walk.
#pragma once

#include <cstddef>
#include <memory>

namespace kvcore {

constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// `bytes` (a multiple of kHugePageBytes) of zeroed memory at a 2 MiB-aligned address, advised as
// huge pages (advice only: a kernel without them gives small pages). Throws std::bad_alloc.
void* map_huge(std::size_t bytes);
void unmap_huge(void* data, std::size_t bytes) noexcept;  // what map_huge(bytes) returned

// An allocator that maps what is a huge page or more with map_huge (rounded up to whole huge
// pages) and takes the rest from the heap. Under AddressSanitizer everything comes from the heap,
// where it is checked.
template <typename T>
struct HugeAllocator {
  using value_type = T;

  HugeAllocator() noexcept = default;
  template <typename U>
  explicit HugeAllocator(const HugeAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);  // n is within max_size(): no overflow
    if (!huge(bytes)) return std::allocator<T>().allocate(n);
    return static_cast<T*>(map_huge(rounded(bytes)));
  }
  void deallocate(T* data, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (!huge(bytes)) {
      std::allocator<T>().deallocate(data, n);
    } else {
      unmap_huge(data, rounded(bytes));
    }
  }
  friend bool operator==(const HugeAllocator&, const HugeAllocator&) noexcept { return true; }
  friend bool operator!=(const HugeAllocator&, const HugeAllocator&) noexcept { return false; }

 private:
  static bool huge(std::size_t bytes) noexcept {
#if defined(__SANITIZE_ADDRESS__)
    (void)bytes;
    return false;
#else
    return bytes >= kHugePageBytes;
#endif
  }
  static std::size_t rounded(std::size_t bytes) noexcept {
    return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  }
};

}  // namespace kvcore
