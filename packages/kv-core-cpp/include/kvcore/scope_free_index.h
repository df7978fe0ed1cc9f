// The scope-free index (docs/manager.md, "Why a prompt missed"; mirrors scope_free_index.py;
// opt-in with reuse_report_other_scope): every full block in the tree under a second key, chained
// from one root shared by all scopes, so that a prompt's missed blocks can be found cached under
// another salt or LoRA id. It costs a second hash of each block committed and of each prompt
// missed.
//
// Keyed by the block's address (Block has no room for a second key): the tree reports a block
// removed before it may be recycled, so an address names one block while it is here. No lock of
// its own: the tree's (REQUIRES: the manager's lock).
#pragma once

#include <cstdint>
#include <unordered_map>

#include "kvcore/constants.h"
#include "kvcore/radix_tree.h"
#include "kvcore/sha256.h"

namespace kvcore {

// The root every scope-free chain starts from (a real scope's root is a SHA-256 digest).
inline constexpr Digest kScopeFreeRoot{};

class ScopeFreeIndex {
 public:
  ScopeFreeIndex(std::int64_t tokens_per_block, KeyFormat format)
      : tokens_per_block_(tokens_per_block), format_(format) {}
  ScopeFreeIndex(const ScopeFreeIndex&) = delete;
  ScopeFreeIndex& operator=(const ScopeFreeIndex&) = delete;

  void added(const Block* block);             // a full block entered the tree (under a full block or a root)
  void removed(const Block* block) noexcept;  // a full block left the tree
  void clear() noexcept;
  bool contains(const Digest& key) const { return counts_.find(key) != counts_.end(); }

 private:
  std::int64_t tokens_per_block_;
  KeyFormat format_;
  std::unordered_map<const Block*, Digest> keys_;                // block -> its scope-free key
  std::unordered_map<Digest, std::int64_t, DigestHash> counts_;  // scope-free key -> blocks under it
};

}  // namespace kvcore
