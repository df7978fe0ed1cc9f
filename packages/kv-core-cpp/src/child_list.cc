#include "kvcore/child_list.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kvcore/radix_tree.h"

namespace kvcore {

namespace {

// Two keys in four 8-byte words, inline (operator== calls memcmp); a different key differs in
// the first word all but never (SHA-256 output).
bool same_key(const Digest& a, const Digest& b) noexcept {
  std::uint64_t x[4], y[4];
  std::memcpy(x, a.data(), sizeof x);
  std::memcpy(y, b.data(), sizeof y);
  return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
}

}  // namespace

Block* ChildList::find(const Digest& key) const noexcept {
  if (heap_ && many_->index) {
    const auto it = many_->index->find(key);
    return it == many_->index->end() ? nullptr : it->second.block;
  }
  for (Block* c : *this) {
    if (same_key(c->key, key)) return c;
  }
  return nullptr;
}

void ChildList::add(Block* child, bool partial) {
  reserve_one_more();  // so that the push cannot throw once the index has the child
  if (heap_) {
    Many& many = *many_;
    const auto position = static_cast<std::uint32_t>(many.items.size());
    if (many.index) {
      many.index->emplace(child->key, IndexedChild{child, position});
    } else if (size_ == kChildScanLimit) {
      auto made = std::make_unique<ChildIndex>();
      for (std::uint32_t i = 0; i < position; ++i) {
        if (Block* c = many.items[i]) made->emplace(c->key, IndexedChild{c, i});
      }
      made->emplace(child->key, IndexedChild{child, position});
      many.index = std::move(made);
    }
    many.items.push_back(child);
  } else {
    one_ = child;  // the first: a second made the heap record above
  }
  ++size_;
  partial_ += partial;
}

void ChildList::remove(Block* child, bool partial) noexcept {
  partial_ -= partial;
  --size_;
  if (!heap_) {
    one_ = nullptr;
    return;
  }
  Many& many = *many_;
  std::vector<Block*>& items = many.items;
  std::size_t position;
  if (many.index) {
    const auto it = many.index->find(child->key);
    position = it->second.position;
    many.index->erase(it);
    if (size_ <= kChildScanLimit) many.index.reset();
  } else {
    position = static_cast<std::size_t>(std::find(items.begin(), items.end(), child) - items.begin());
  }
  items[position] = nullptr;
  while (!items.empty() && items.back() == nullptr) items.pop_back();  // the list ends in a child (back())
  if (items.size() - size_ > size_) close_gaps();                      // the gaps outnumber the children
}

void ChildList::clear() noexcept {
  if (heap_) {
    many_->items.clear();
    many_->index.reset();
  } else {
    one_ = nullptr;
  }
  size_ = 0;
  partial_ = 0;
}

void ChildList::reserve_one_more() {
  if (heap_) {
    std::vector<Block*>& items = many_->items;
    if (items.size() == items.capacity()) items.reserve(std::max<std::size_t>(2, 2 * items.size()));
  } else if (size_ == 1) {
    auto many = std::make_unique<Many>();
    many->items.reserve(2);
    many->items.push_back(one_);
    many_ = many.release();
    heap_ = 1;
  }
}

void ChildList::close_gaps() noexcept {
  Many& many = *many_;
  std::vector<Block*>& items = many.items;
  std::size_t to = 0;
  for (std::size_t from = 0; from < items.size(); ++from) {
    Block* c = items[from];
    if (c == nullptr) continue;
    if (many.index) many.index->find(c->key)->second.position = static_cast<std::uint32_t>(to);
    items[to++] = c;
  }
  items.resize(to);
}

}  // namespace kvcore
