// Keys a reuse report hashed, kept for the commit (prompt_keys.h; prompt_keys.py).
#include "kvcore/prompt_keys.h"

#include <cstring>

namespace kvcore {

void PromptKeys::keep(const Tokens& tokens, const Digest& parent_key, std::int64_t first_block, std::size_t count,
                      std::size_t tokens_per_block, const std::uint8_t* out) {
  if (!tokens.digests.empty() || count == 0) return;
  if (keys.empty()) {
    parent = parent_key;
    first = first_block;
  } else if (first_block != first + static_cast<std::int64_t>(size())) {
    return;  // not the next blocks: the kept run stays as it is
  }
  keys.insert(keys.end(), out + 32, out + 32 * (count + 1));
  const std::size_t begin = static_cast<std::size_t>(first_block) * tokens_per_block;
  const std::size_t at = ids.size();
  ids.resize(at + count * tokens_per_block);
  tokens.pack(begin, begin + count * tokens_per_block, sizeof(std::uint64_t),
              reinterpret_cast<std::uint8_t*>(ids.data() + at));
}

std::size_t PromptKeys::usable(const Digest& parent_key, const TokenList& committed, std::int64_t ordinal,
                               std::size_t limit, std::size_t tokens_per_block) const noexcept {
  if (ordinal < first || ordinal >= first + static_cast<std::int64_t>(size())) return 0;
  const std::uint8_t* expected = ordinal == first ? parent.data() : at(ordinal - 1);
  if (std::memcmp(expected, parent_key.data(), 32) != 0) return 0;
  const std::size_t skip = static_cast<std::size_t>(ordinal - first);
  const std::size_t begin = static_cast<std::size_t>(ordinal) * tokens_per_block;
  const std::size_t digest = committed.first_digest_at_or_after(begin);
  std::size_t n = 0;
  while (n < limit && skip + n < size()) {
    const std::size_t lo = begin + n * tokens_per_block;
    const std::size_t hi = lo + tokens_per_block;
    if (hi > committed.size()) break;
    if (digest < committed.digests.size() && committed.digests[digest].position < hi) break;
    if (std::memcmp(committed.ids.data() + lo, ids.data() + (skip + n) * tokens_per_block,
                    tokens_per_block * sizeof(std::uint64_t)) != 0) {
      break;
    }
    ++n;
  }
  return n;
}

void PromptKeys::reserve(std::size_t blocks, std::size_t tokens_per_block) {
  keys.reserve(keys.size() + 32 * blocks);
  ids.reserve(ids.size() + tokens_per_block * blocks);
}

void PromptKeys::clear() noexcept {
  std::vector<std::uint8_t>().swap(keys);
  decltype(ids)().swap(ids);
}

}  // namespace kvcore
