// A radix-tree node's children, in insertion order. The first is kept inline: most blocks of a
// long prompt have exactly one child, and a heap buffer would cost a cache miss on every step of
// a walk, every commit under the node and every removal of a child (an eviction). From the
// second child on they live in a heap record (the list, and the key index a node keeps past
// kChildScanLimit children), kept once made while the node lives (a recycled block reuses it).
// 16 bytes in all: a tree holds millions of nodes. The list holds the pointers only: its Node
// owns the children (add_child, take_child, ~Node). No lock of its own: the tree's, under the
// manager's lock. It also counts its partial children (fewer tokens than a block holds; the tree
// says which): a commit looks for a partial sibling its block extends, and a node with thousands
// of full children (a scope's root) has none.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kvcore/sha256.h"

namespace kvcore {

class Block;

struct DigestHash {
  std::size_t operator()(const Digest& d) const noexcept {
    std::size_t h;
    std::memcpy(&h, d.data(), sizeof h);  // SHA-256 output: any 8 bytes are uniform
    return h;
  }
};

using ChildIndex = std::unordered_map<Digest, Block*, DigestHash>;

class ChildList {
 public:
  ChildList() : size_(0), heap_(0) {}
  ChildList(const ChildList&) = delete;
  ChildList& operator=(const ChildList&) = delete;
  ~ChildList() {
    if (heap_) delete many_;
  }

  std::size_t size() const noexcept { return size_; }
  std::size_t partial() const noexcept { return partial_; }
  bool empty() const noexcept { return size_ == 0; }
  Block* const* begin() const noexcept { return heap_ ? many_->items.data() : &one_; }
  Block* const* end() const noexcept { return begin() + size_; }
  Block* back() const noexcept { return begin()[size_ - 1]; }
  // The key index, where the node keeps one.
  ChildIndex* index() const noexcept { return heap_ ? many_->index.get() : nullptr; }
  void set_index(std::unique_ptr<ChildIndex> index) noexcept { many_->index = std::move(index); }  // heap_ only

  // Room for one more child, so that the next push_back cannot throw (std::bad_alloc here
  // changes nothing).
  void reserve_one_more() {
    if (heap_) {
      if (many_->items.capacity() < size_ + 1u) many_->items.reserve(std::max<std::size_t>(2, 2 * size_));
    } else if (size_ == 1) {
      auto many = std::make_unique<Many>();
      many->items.reserve(2);
      many->items.push_back(one_);
      many_ = many.release();
      heap_ = 1;
    }
  }
  void push_back(Block* child, bool partial) noexcept {  // after reserve_one_more
    partial_ += partial;
    if (heap_) {
      many_->items.push_back(child);
    } else {
      one_ = child;
    }
    ++size_;
  }
  void erase(Block* child, bool partial) noexcept {  // a present child
    partial_ -= partial;
    if (heap_) {
      many_->items.erase(std::find(many_->items.begin(), many_->items.end(), child));
    } else {
      one_ = nullptr;
    }
    --size_;
  }
  void clear() noexcept {  // the heap record stays
    if (heap_) {
      many_->items.clear();
      many_->index.reset();
    } else {
      one_ = nullptr;
    }
    size_ = 0;
    partial_ = 0;
  }

 private:
  struct Many {
    std::vector<Block*> items;
    std::unique_ptr<ChildIndex> index;  // key -> child, only past kChildScanLimit children
  };
  union {
    Block* one_ = nullptr;  // the only child, until a second came
    Many* many_;            // owned, from then on
  };
  std::uint32_t size_ : 31;
  std::uint32_t heap_ : 1;
  std::uint32_t partial_ = 0;  // the partial children among them
};

}  // namespace kvcore
