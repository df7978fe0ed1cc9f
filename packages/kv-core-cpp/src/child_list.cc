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
  if (const Many* m = many(); m != nullptr && m->index) {
    const auto it = m->index->find(key);
    return it == m->index->end() ? nullptr : it->second.block;
  }
  for (Block* c : *this) {
    if (same_key(c->key, key)) return c;
  }
  return nullptr;
}

void ChildList::add(Block* child) {
  reserve_one_more();  // so that the push cannot throw once the index has the child
  Many* m = many();
  if (m == nullptr) {
    one_ = child;  // the first: a second made the heap record above
    return;
  }
  const auto position = static_cast<std::uint32_t>(m->items.size());
  if (m->index) {
    m->index->emplace(child->key, IndexedChild{child, position});
  } else if (m->size == kChildScanLimit) {
    auto made = std::make_unique<ChildIndex>();
    for (std::uint32_t i = 0; i < position; ++i) {
      if (Block* c = m->items[i]) made->emplace(c->key, IndexedChild{c, i});
    }
    made->emplace(child->key, IndexedChild{child, position});
    m->index = std::move(made);
  }
  m->items.push_back(child);
  ++m->size;
  m->partial += child->partial();
}

void ChildList::remove(Block* child) noexcept {
  Many* m = many();
  if (m == nullptr) {
    one_ = nullptr;
    return;
  }
  Many& many = *m;
  many.partial -= child->partial();
  const std::uint32_t size = --many.size;
  std::vector<Block*>& items = many.items;
  std::size_t position;
  if (many.index) {
    const auto it = many.index->find(child->key);
    position = it->second.position;
    many.index->erase(it);
    if (size <= kChildScanLimit) many.index.reset();
  } else {
    position = static_cast<std::size_t>(std::find(items.begin(), items.end(), child) - items.begin());
  }
  items[position] = nullptr;
  while (!items.empty() && items.back() == nullptr) items.pop_back();  // the list ends in a child (back())
  if (items.size() - size > size) close_gaps();                        // the gaps outnumber the children
}

void ChildList::clear() noexcept {
  if (Many* m = many()) {
    m->items.clear();
    m->index.reset();
    m->size = 0;
    m->partial = 0;
  } else {
    one_ = nullptr;
  }
}

void ChildList::reserve_one_more() {
  if (Many* m = many()) {
    std::vector<Block*>& items = m->items;
    if (items.size() == items.capacity()) items.reserve(std::max<std::size_t>(2, 2 * items.size()));
  } else if (one_ != nullptr) {
    auto made = std::make_unique<Many>();
    made->items.reserve(2);
    made->items.push_back(one_);
    made->size = 1;
    made->partial = one_->partial();  // the tree marked it when it filled its tokens
    one_ = reinterpret_cast<Block*>(reinterpret_cast<std::uintptr_t>(made.release()) | kHeap);
  }
}

void ChildList::close_gaps() noexcept {
  Many& many = *this->many();
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
