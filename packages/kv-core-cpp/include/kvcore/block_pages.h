// A tree block's pages, one per layer group, in one word: a tree holds millions of blocks and
// most layouts have one layer group, whose page pointer is the word itself; more layer groups
// keep theirs on the heap, the word pointing there with its low bit set (a page record is
// 8-aligned). Every block of a tree has the same number of layer groups. The native layout of
// what the Python backend keeps as a list (radix_tree.py), not a concept of its own there. No
// lock of its own: the manager's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace kvcore {

struct Page;

class BlockPages {
 public:
  explicit BlockPages(std::size_t n) {
    if (n == 1) return;
    // The count first, then the pages: one allocation, every entry a Page* (no type punning).
    Page** array = new Page*[n + 1]();
    array[0] = reinterpret_cast<Page*>(n);
    word_ = reinterpret_cast<Page*>(reinterpret_cast<std::uintptr_t>(array) | kHeap);
  }
  BlockPages(const BlockPages&) = delete;
  BlockPages& operator=(const BlockPages&) = delete;
  ~BlockPages() { delete[] heap(); }

  std::size_t size() const noexcept { return on_heap() ? reinterpret_cast<std::uintptr_t>(heap()[0]) : 1; }
  Page** data() noexcept { return on_heap() ? heap() + 1 : &word_; }
  Page* const* data() const noexcept { return on_heap() ? heap() + 1 : &word_; }
  Page*& operator[](std::size_t i) noexcept { return data()[i]; }
  Page* operator[](std::size_t i) const noexcept { return data()[i]; }
  Page** begin() noexcept { return data(); }
  Page** end() noexcept { return data() + size(); }
  Page* const* begin() const noexcept { return data(); }
  Page* const* end() const noexcept { return data() + size(); }

 private:
  static constexpr std::uintptr_t kHeap = 1;
  bool on_heap() const noexcept { return (reinterpret_cast<std::uintptr_t>(word_) & kHeap) != 0; }
  Page** heap() const noexcept {
    return on_heap() ? reinterpret_cast<Page**>(reinterpret_cast<std::uintptr_t>(word_) & ~kHeap) : nullptr;
  }

  Page* word_ = nullptr;  // the only page (nullptr: none), or the tagged heap array
};

}  // namespace kvcore
