// A radix-tree node's children, in insertion order, and their key index. The first is kept
// inline: most blocks of a long prompt have exactly one child, and a heap buffer would cost a
// cache miss on every step of a walk, every commit under the node and every removal of a child
// (an eviction). From the second child on they live in a heap record (the list, and the key
// index a node keeps past kChildScanLimit children), kept once made while the node lives (a
// recycled block reuses it). 8 bytes in all: a tree holds millions of nodes. The list holds the
// pointers only: the tree owns the blocks (its arena, radix_tree.h). No lock of its own: the
// tree's, under the manager's lock.
//
// A removed child leaves a gap in the heap list rather than shifting the rest down: a scope's
// root holds one child per distinct prompt (tens of thousands in a large cache), and every
// eviction of a prompt's first block removed one of them, a memmove of the whole list. The index
// keeps each child's position, so a removal finds its gap without a scan; the gaps are closed
// once they outnumber the children (amortised O(1)); iteration skips them.
//
// It also counts its partial children (fewer tokens than a block holds; each says so): a
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

  ChildList() = default;
  ChildList(const ChildList&) = delete;
  ChildList& operator=(const ChildList&) = delete;
  ~ChildList() { delete many(); }

  std::size_t size() const noexcept { return is_heap() ? many()->size : (one_ != nullptr); }
  // At most this many children are partial: exact from the second child on; a lone child
  // counts as one (a caller scanning for a partial child scans that one).
  std::size_t partial() const noexcept { return is_heap() ? many()->partial : (one_ != nullptr); }
  bool empty() const noexcept { return size() == 0; }
  Iterator begin() const noexcept { return {first(), last()}; }
  Iterator end() const noexcept { return {last(), last()}; }
  Block* back() const noexcept { return is_heap() ? many()->items.back() : one_; }  // the list ends in a child

  // The child with this key, or nullptr: a scan up to kChildScanLimit children, the index past.
  Block* find(const Digest& key) const noexcept;
  // `child` (not yet a child, its partial flag set: Node::partial) appended. On std::bad_alloc
  // nothing changed.
  void add(Block* child);
  // `child` (a present child) removed, its position left a gap.
  void remove(Block* child) noexcept;
  void clear() noexcept;  // the heap record stays

 private:
  struct Many {
    std::vector<Block*> items;          // the children, nullptr where one was removed (size live)
    std::unique_ptr<ChildIndex> index;  // key -> child, only past kChildScanLimit children
    std::uint32_t size = 0;
    std::uint32_t partial = 0;  // the partial children among them
  };
  // One word: the only child (or none) until a second came, then the owned heap record with
  // its low bit set (blocks and records are at least 2-aligned). Always read as a Block*, the
  // tag tested on its integer value: no type punning.
  static constexpr std::uintptr_t kHeap = 1;

  bool is_heap() const noexcept { return (reinterpret_cast<std::uintptr_t>(one_) & kHeap) != 0; }
  Many* many() const noexcept {
    return is_heap() ? reinterpret_cast<Many*>(reinterpret_cast<std::uintptr_t>(one_) & ~kHeap) : nullptr;
  }
  Block* const* first() const noexcept { return is_heap() ? many()->items.data() : &one_; }
  Block* const* last() const noexcept {
    return is_heap() ? many()->items.data() + many()->items.size() : &one_ + (one_ != nullptr);
  }
  void reserve_one_more();
  void close_gaps() noexcept;

  Block* one_ = nullptr;
};

}  // namespace kvcore
