// Keys a reuse report hashed past a prompt's match (mirrors prompt_keys.py): find_misses hashes
// the prompt's next blocks to look them up in the ghost record, and the cache's commit of the
// same blocks would hash them again (an evicted run of a long prompt: hundreds of SHA-256
// chains). The cache keeps them for its commit; a key is used only where the block's committed
// tokens are the ones hashed and its parent's key is the one it was chained from, so what a
// cache commits changes no key. Plain data (REQUIRES: its cache's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvcore/sha256.h"
#include "kvcore/tokens.h"

namespace kvcore {

struct PromptKeys {
  Digest parent{};                 // block `first - 1`'s key (the scope's root key for block 0)
  std::int64_t first = 0;          // the first block hashed
  std::vector<std::uint8_t> keys;  // 32 bytes per block, in order
  // Those blocks' token ids (prompts without digest tokens only); not zeroed first: each is
  // written as it is kept.
  std::vector<std::uint64_t, UninitializedAllocator<std::uint64_t>> ids;

  std::size_t size() const noexcept { return keys.size() / 32; }
  // Keeps the keys of `tokens`' blocks [first, first + count) chained from `parent_key` (`out`:
  // chained_keys' output, the parent then each key), appending to those kept when they follow
  // them. Nothing for a prompt with digest tokens (its ids alone do not say what was hashed).
  void keep(const Tokens& tokens, const Digest& parent_key, std::int64_t first_block, std::size_t count,
            std::size_t tokens_per_block, const std::uint8_t* out);
  // Room for `blocks` more blocks' keys and ids, so that keeping a long prompt's keys batch by
  // batch does not move what is kept at every growth.
  void reserve(std::size_t blocks, std::size_t tokens_per_block);
  // How many of blocks `ordinal`, `ordinal + 1`, ... (fewer than `limit`) of `committed`,
  // chained from `parent_key`, have their key here: the first of them is at(ordinal).
  std::size_t usable(const Digest& parent_key, const TokenList& committed, std::int64_t ordinal, std::size_t limit,
                     std::size_t tokens_per_block) const noexcept;
  const std::uint8_t* at(std::int64_t ordinal) const noexcept {
    return keys.data() + 32 * static_cast<std::size_t>(ordinal - first);
  }
  void clear() noexcept;  // and its memory
};

}  // namespace kvcore
