// A hint to bring memory into the cache before it is read: it changes no result, and an address
// it is given is never dereferenced. No state: any thread.
#pragma once

#include <cstddef>

namespace kvcore {

inline void prefetch(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}

// Every 64-byte line of the `size` bytes at `p`.
inline void prefetch_lines(const void* p, std::size_t size) noexcept {
  for (std::size_t offset = 0; offset < size; offset += 64) prefetch(static_cast<const char*>(p) + offset);
}

}  // namespace kvcore
