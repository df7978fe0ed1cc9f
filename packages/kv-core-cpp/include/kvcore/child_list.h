// A radix-tree node's children, in insertion order. The first is kept inline: most blocks of a
// long prompt have exactly one child, and a heap buffer would cost a cache miss on every step of
// a walk, every commit under the node and every removal of a child (an eviction). Two or more
// live in a heap vector, whose capacity stays when the list shrinks (a recycled block reuses it).
// The list holds the pointers only: its Node owns the children (add_child, take_child, ~Node). No
// lock of its own: the tree's, under the manager's lock. It also counts its partial children
// (fewer tokens than a block holds; the tree says which): a commit looks for a partial sibling
// its block extends, and a node with thousands of full children (a scope's root) has none.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcore {

class Block;

class ChildList {
 public:
  std::size_t size() const noexcept { return size_; }
  std::size_t partial() const noexcept { return partial_; }
  bool empty() const noexcept { return size_ == 0; }
  Block* const* begin() const noexcept { return size_ <= 1 ? &one_ : many_.data(); }
  Block* const* end() const noexcept { return begin() + size_; }
  Block* back() const noexcept { return begin()[size_ - 1]; }

  // Room for one more child, so that the next push_back cannot throw (std::bad_alloc here
  // changes nothing).
  void reserve_one_more() {
    if (size_ >= 1 && many_.capacity() < size_ + 1) many_.reserve(std::max<std::size_t>(2, 2 * size_));
  }
  void push_back(Block* child, bool partial) noexcept {  // after reserve_one_more
    partial_ += partial;
    if (size_ == 0) {
      one_ = child;
    } else {
      if (size_ == 1) many_.push_back(one_);
      many_.push_back(child);
    }
    ++size_;
  }
  void erase(Block* child, bool partial) noexcept {  // a present child
    partial_ -= partial;
    if (size_ == 1) {
      one_ = nullptr;
    } else {
      many_.erase(std::find(many_.begin(), many_.end(), child));
      if (many_.size() == 1) {
        one_ = many_.front();
        many_.clear();
      }
    }
    --size_;
  }
  void clear() noexcept {
    one_ = nullptr;
    many_.clear();
    size_ = 0;
    partial_ = 0;
  }

 private:
  Block* one_ = nullptr;      // the only child
  std::vector<Block*> many_;  // every child, once there are two or more (else empty)
  std::uint32_t size_ = 0;
  std::uint32_t partial_ = 0;  // the partial children among them
};

}  // namespace kvcore
