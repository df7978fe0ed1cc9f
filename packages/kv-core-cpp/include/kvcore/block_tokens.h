// A block's tokens as the radix tree keeps them: compact, since a tree holds millions of blocks
// (docs/performance.md, "Cost as the cache grows"). The ids are 4-byte integers while every one
// of the block's fits, 8-byte ones otherwise, in the block's own allocation; the digest tokens
// (multimodal, rare) and wide ids on the heap, allocated only where a block has them. The Python
// backend keeps a block's tokens as a tuple (radix_tree.py): this file is the native layout, not
// a concept of its own there.
//
// Plain values and functions with no lock: the tree's, the manager's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kvcore/tokens.h"

namespace kvcore {

using DigestTokens = std::vector<DigestToken>;

// How a block keeps its tokens; the tree keeps these bits in the block's own word (radix_tree.h).
struct TokenHeader {
  std::uint32_t size = 0;  // <= 2**20 (kv_api's TOKENS_PER_BLOCK_LIMIT)
  bool wide = false;       // 8-byte ids
  bool digests = false;    // a list of digest tokens comes first
  bool heap = false;       // in one heap allocation the area points to, not in the area
};

// A block's tokens, read-only: a view of its token area, valid while the block's tokens stay.
class BlockTokens {
 public:
  BlockTokens(const std::uint8_t* ids, std::size_t size, bool wide, const DigestTokens* digests) noexcept
      : ids_(ids), size_(size), wide_(wide), digests_(digests) {}

  std::size_t size() const noexcept { return size_; }
  std::uint64_t raw(std::size_t i) const noexcept {
    if (wide_) {
      std::uint64_t v;
      std::memcpy(&v, ids_ + 8 * i, 8);
      return v;
    }
    std::uint32_t v;
    std::memcpy(&v, ids_ + 4 * i, 4);
    return v;
  }
  bool has_digests() const noexcept { return digests_ != nullptr; }
  const Digest* digest_at(std::size_t i) const noexcept;
  TokenList to_list() const;
  // A Tokens view (4- or 8-byte ids) for the hashers; valid while the block's tokens stay.
  Tokens view() const;

 private:
  const std::uint8_t* ids_;
  std::size_t size_;
  bool wide_;
  const DigestTokens* digests_;
};

// A block's token area: `area_bytes` (at least 8, a multiple of 8) bytes the tree allocates with
// the block. Ids that all fit in 4 bytes, without digest tokens, are kept there when they fit
// (a full block's always do: the tree sizes the area for them); otherwise the area holds a
// pointer to one heap allocation: the (owned) list of digest tokens, sorted by position, where
// there are any, then the ids, 4 or 8 bytes each, little-endian.
//
// Makes the area hold tokens [begin, end) of `source` and returns its header; `old` is what it
// held (its heap allocation freed). On std::bad_alloc nothing changed.
TokenHeader store_tokens(std::uint8_t* area, std::size_t area_bytes, TokenHeader old, const TokenList& source,
                         std::size_t begin, std::size_t end);
void release_tokens(std::uint8_t* area, TokenHeader header) noexcept;  // its heap allocation, if any
BlockTokens tokens_in(const std::uint8_t* area, TokenHeader header) noexcept;

inline bool digests_in(const BlockTokens& t) noexcept { return t.has_digests(); }
inline bool digests_in(const TokenList& t) noexcept { return !t.digests.empty(); }
inline bool digests_in(const Tokens& t) noexcept { return !t.digests.empty(); }

// Whether token i of `a` and token j of `b` are the same token (a digest token matches by its
// digest); A and B are TokenList, BlockTokens or Tokens.
template <typename A, typename B>
bool same_token(const A& a, std::size_t i, const B& b, std::size_t j) noexcept {
  const Digest* da = digests_in(a) ? a.digest_at(i) : nullptr;
  const Digest* db = digests_in(b) ? b.digest_at(j) : nullptr;
  if ((da == nullptr) != (db == nullptr)) return false;
  return da != nullptr ? *da == *db : a.raw(i) == b.raw(j);
}

}  // namespace kvcore
