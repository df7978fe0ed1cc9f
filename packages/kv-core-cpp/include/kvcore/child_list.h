// A radix-tree node's children, in insertion order, and their key index. The first is kept
// inline: most blocks of a long prompt have exactly one child, and a heap buffer would cost a
// cache miss on every step of a walk, every commit under the node and every removal of a child
// (an eviction). From the second child on they live in a heap record (the list, and the key
// index a node keeps past kChildScanLimit children), kept once made while the node lives (a
// recycled block reuses it). 16 bytes in all: a tree holds millions of nodes. The list holds the
// pointers only: its Node owns the children (add_child, take_child, ~Node). No lock of its own:
// the tree's, under the manager's lock.
//
// A removed child leaves a gap in the heap list rather than shifting the rest down: a scope's
// root holds one child per distinct prompt (tens of thousands in a large cache), and every
// eviction of a prompt's first block removed one of them, a memmove of the whole list. The index
// keeps each child's position, so a removal finds its gap without a scan; the gaps are closed
// once they outnumber the children (amortised O(1)); iteration skips them.
//
// It also counts its partial children (fewer tokens than a block holds; the tree says which): a
// commit looks for a partial sibling its block extends, and a node with thousands of full
// children (a scope's root) has none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
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

struct IndexedChild {
  Block* block;
  std::uint32_t position;  // in the heap list, gaps included
};

using ChildIndex = std::unordered_map<Digest, IndexedChild, DigestHash>;

class ChildList {
 public:
  // Over the children, past the gaps.
  class Iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Block*;
    using difference_type = std::ptrdiff_t;
    using pointer = Block* const*;
    using reference = Block* const&;

    Iterator(Block* const* at, Block* const* end) noexcept : at_(at), end_(end) { skip(); }
    reference operator*() const noexcept { return *at_; }
    Iterator& operator++() noexcept {
      ++at_;
      skip();
      return *this;
    }
    Iterator operator++(int) noexcept {
      Iterator was = *this;
      ++*this;
      return was;
    }
    bool operator==(const Iterator& other) const noexcept { return at_ == other.at_; }
    bool operator!=(const Iterator& other) const noexcept { return at_ != other.at_; }

   private:
    void skip() noexcept {
      while (at_ != end_ && *at_ == nullptr) ++at_;
    }
    Block* const* at_;
    Block* const* end_;
  };

  ChildList() : size_(0), heap_(0) {}
  ChildList(const ChildList&) = delete;
  ChildList& operator=(const ChildList&) = delete;
  ~ChildList() {
    if (heap_) delete many_;
  }

  std::size_t size() const noexcept { return size_; }
  std::size_t partial() const noexcept { return partial_; }
  bool empty() const noexcept { return size_ == 0; }
  Iterator begin() const noexcept { return {first(), last()}; }
  Iterator end() const noexcept { return {last(), last()}; }
  Block* back() const noexcept { return heap_ ? many_->items.back() : one_; }  // the list ends in a child

  // The child with this key, or nullptr: a scan up to kChildScanLimit children, the index past.
  Block* find(const Digest& key) const noexcept;
  // `child` (not yet a child; `partial`: it holds fewer tokens than a full block) appended. On
  // std::bad_alloc nothing changed.
  void add(Block* child, bool partial);
  // `child` (a present child) removed, its position left a gap.
  void remove(Block* child, bool partial) noexcept;
  void clear() noexcept;  // the heap record stays

 private:
  struct Many {
    std::vector<Block*> items;          // the children, nullptr where one was removed (size_ live)
    std::unique_ptr<ChildIndex> index;  // key -> child, only past kChildScanLimit children
  };

  Block* const* first() const noexcept { return heap_ ? many_->items.data() : &one_; }
  Block* const* last() const noexcept { return heap_ ? many_->items.data() + many_->items.size() : &one_ + size_; }
  void reserve_one_more();
  void close_gaps() noexcept;

  union {
    Block* one_ = nullptr;  // the only child, until a second came
    Many* many_;            // owned, from then on
  };
  std::uint32_t size_ : 31;
  std::uint32_t heap_ : 1;
  std::uint32_t partial_ = 0;  // the partial children among them
};

}  // namespace kvcore
