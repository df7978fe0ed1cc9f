// A fixed-size array with one entry per layer group, stored inline for the usual few layer groups:
// a cache keeps one per block for its pages and another for their locks, so a heap vector each
// would cost two allocations per block on every admission of a long prompt. A value (copied and
// moved whole) with no lock of its own: its owner's, the manager's lock for a cache's blocks and
// a tree block's pages.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>

namespace kvcore {

template <typename T, std::size_t Inline = 4>
class PerLayerGroup {
 public:
  PerLayerGroup(std::size_t n, const T& value) : size_(n) {
    if (n > Inline) heap_ = std::make_unique<T[]>(n);
    std::fill(begin(), end(), value);
  }
  PerLayerGroup(const PerLayerGroup& other) : PerLayerGroup(other.size_, T{}) {
    std::copy(other.begin(), other.end(), begin());
  }
  PerLayerGroup(PerLayerGroup&& other) noexcept
      : inline_(other.inline_), heap_(std::move(other.heap_)), size_(other.size_) {
    other.size_ = 0;
  }
  PerLayerGroup& operator=(const PerLayerGroup& other) {
    if (this != &other) *this = PerLayerGroup(other);
    return *this;
  }
  PerLayerGroup& operator=(PerLayerGroup&& other) noexcept {
    inline_ = other.inline_;
    heap_ = std::move(other.heap_);
    size_ = other.size_;
    other.size_ = 0;
    return *this;
  }
  ~PerLayerGroup() = default;

  std::size_t size() const noexcept { return size_; }
  T* data() noexcept { return heap_ ? heap_.get() : inline_.data(); }
  const T* data() const noexcept { return heap_ ? heap_.get() : inline_.data(); }
  T& operator[](std::size_t i) noexcept { return data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + size_; }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + size_; }

 private:
  std::array<T, Inline> inline_{};
  std::unique_ptr<T[]> heap_;  // beyond Inline entries
  std::size_t size_;
};

}  // namespace kvcore
