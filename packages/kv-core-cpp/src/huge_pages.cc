// Huge-page mappings (huge_pages.h).
#include "kvcore/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

namespace kvcore {

void* map_huge(std::size_t bytes) {
  // A huge page needs a 2 MiB-aligned range: a huge page more is mapped and the unaligned ends
  // given back.
  const std::size_t mapped_bytes = bytes + kHugePageBytes;
  void* mapped = mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(mapped);
  const std::uintptr_t aligned = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (aligned > start) munmap(mapped, aligned - start);
  const std::uintptr_t end = start + mapped_bytes;
  if (end > aligned + bytes) munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // advice only: none is fine
#endif
  return reinterpret_cast<void*>(aligned);
}

void unmap_huge(void* data, std::size_t bytes) noexcept { munmap(data, bytes); }

}  // namespace kvcore
