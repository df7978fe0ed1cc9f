// The scope-free index (scope_free_index.py): a block's scope-free key is chained from its
// parent's as its own key is, through the same kernel.
#include "kvcore/scope_free_index.h"

#include <cstring>

#include "kvcore/block_keys.h"

namespace kvcore {

void ScopeFreeIndex::added(const Block* block) {
  const Node* parent = block->parent;
  const Digest* parent_key = &kScopeFreeRoot;
  if (!parent->is_root()) {
    const auto it = keys_.find(static_cast<const Block*>(parent));
    if (it != keys_.end()) parent_key = &it->second;
  }
  std::uint8_t out[64];
  chained_keys(*parent_key, block->tokens().view(), 0, 1, static_cast<std::size_t>(tokens_per_block_), format_, out);
  Digest key;
  std::memcpy(key.data(), out + 32, key.size());
  keys_[block] = key;
  ++counts_[key];
}

void ScopeFreeIndex::removed(const Block* block) noexcept {
  const auto it = keys_.find(block);
  if (it == keys_.end()) return;
  const auto count = counts_.find(it->second);
  if (--count->second == 0) counts_.erase(count);
  keys_.erase(it);
}

void ScopeFreeIndex::clear() noexcept {
  keys_.clear();
  counts_.clear();
}

}  // namespace kvcore
