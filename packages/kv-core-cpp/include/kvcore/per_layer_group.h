// A fixed-size array with one entry per layer group, stored inline for the usual few layer groups:
// a cache keeps one per block for its pages and another for their locks, so a heap vector each
// would cost two allocations per block on every admission of a long prompt. The inline entries
// and the heap pointer share their bytes. (A tree block keeps its pages in one word instead:
// block_pages.h.) A value (copied and moved whole) with no lock of its own: its owner's, the
// manager's lock for a cache's blocks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvcore {

template <typename T, std::size_t Inline = 4>
class PerLayerGroup {
  static_assert(std::is_trivially_copyable_v<T>, "entries are copied as bytes");

 public:
  PerLayerGroup(std::size_t n, const T& value) : size_(static_cast<std::uint32_t>(n)) {
    if (n > Inline) heap_ = new T[n];
    std::fill(begin(), end(), value);
  }
  PerLayerGroup(const PerLayerGroup& other) : PerLayerGroup(other.size_, T{}) {
    std::copy(other.begin(), other.end(), begin());
  }
  PerLayerGroup(PerLayerGroup&& other) noexcept : size_(other.size_) { take(other); }
  PerLayerGroup& operator=(const PerLayerGroup& other) {
    if (this != &other) *this = PerLayerGroup(other);
    return *this;
  }
  PerLayerGroup& operator=(PerLayerGroup&& other) noexcept {
    if (this != &other) {
      release();
      size_ = other.size_;
      take(other);
    }
    return *this;
  }
  ~PerLayerGroup() { release(); }

  std::size_t size() const noexcept { return size_; }
  T* data() noexcept { return size_ > Inline ? heap_ : inline_; }
  const T* data() const noexcept { return size_ > Inline ? heap_ : inline_; }
  T& operator[](std::size_t i) noexcept { return data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + size_; }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + size_; }

 private:
  union {
    T inline_[Inline];  // up to Inline entries
    T* heap_;           // owned, beyond
  };
  std::uint32_t size_;

  void take(PerLayerGroup& other) noexcept {  // other's entries, other left empty
    if (size_ > Inline) {
      heap_ = other.heap_;
    } else {
      std::copy(other.inline_, other.inline_ + size_, inline_);
    }
    other.size_ = 0;
  }
  void release() noexcept {
    if (size_ > Inline) delete[] heap_;
  }
};

}  // namespace kvcore
