// A block's tokens as the radix tree keeps them: compact, since a tree holds millions of blocks
// (docs/performance.md, "Cost as the cache grows"). The ids are 4-byte integers while every one
// of the block's fits, 8-byte ones otherwise; the digest tokens (multimodal, rare) live on the
// side, allocated only where a block has one. The Python backend keeps a block's tokens as a
// tuple (radix_tree.py): this file is the native layout, not a concept of its own there.
//
// A plain value with no lock, as TokenList.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kvcore/tokens.h"

namespace kvcore {

class BlockTokens {
 public:
  BlockTokens() : capacity_(0), wide_(0), digests_(0) {}
  BlockTokens(const BlockTokens&) = delete;
  BlockTokens& operator=(const BlockTokens&) = delete;
  ~BlockTokens() { release_digests(); }

  std::size_t size() const noexcept { return size_; }
  // Bytes of storage held (kept across assign(): a recycled block reuses it).
  std::size_t capacity_bytes() const noexcept { return capacity_; }
  std::uint64_t raw(std::size_t i) const noexcept {
    const std::uint8_t* ids = this->ids();
    if (wide_) {
      std::uint64_t v;
      std::memcpy(&v, ids + 8 * i, 8);
      return v;
    }
    std::uint32_t v;
    std::memcpy(&v, ids + 4 * i, 4);
    return v;
  }
  bool has_digests() const noexcept { return digests_ != 0; }
  const Digest* digest_at(std::size_t i) const noexcept;

  // Makes these tokens [begin, end) of `source`, reusing the storage when it is large enough.
  void assign(const TokenList& source, std::size_t begin, std::size_t end);
  TokenList to_list() const;
  // A Tokens view (4- or 8-byte ids) for the hashers; valid while these tokens are unchanged.
  Tokens view() const;

 private:
  using DigestTokens = std::vector<DigestToken>;

  // One allocation: with digest tokens, first the (owned) list of them, sorted by position;
  // then size_ ids, 4 or 8 bytes each (wide_), little-endian.
  std::unique_ptr<std::uint8_t[]> storage_;
  std::uint32_t size_ = 0;
  std::uint32_t capacity_ : 30;
  std::uint32_t wide_ : 1;
  std::uint32_t digests_ : 1;

  const std::uint8_t* ids() const noexcept { return storage_.get() + (digests_ ? sizeof(DigestTokens*) : 0); }
  const DigestTokens* digest_list() const noexcept;
  void release_digests() noexcept;
};

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
