#include "kvcore/block_tokens.h"

#include <algorithm>

namespace kvcore {

const BlockTokens::DigestTokens* BlockTokens::digest_list() const noexcept {
  if (!digests_) return nullptr;
  const DigestTokens* list;
  std::memcpy(&list, storage_.get(), sizeof list);
  return list;
}

void BlockTokens::release_digests() noexcept {
  delete digest_list();
  digests_ = 0;
}

const Digest* BlockTokens::digest_at(std::size_t i) const noexcept {
  const DigestTokens* list = digest_list();
  if (list == nullptr) return nullptr;
  const auto it = std::lower_bound(list->begin(), list->end(), i,
                                   [](const DigestToken& d, std::size_t pos) { return d.position < pos; });
  return it != list->end() && it->position == i ? &it->digest : nullptr;
}

void BlockTokens::assign(const TokenList& source, std::size_t begin, std::size_t end) {
  const std::size_t n = end - begin;
  const std::uint64_t* ids = source.ids.data() + begin;
  std::uint64_t all = 0;  // every id's bits: a loop without an exit vectorises
  for (std::size_t i = 0; i < n; ++i) all |= ids[i];
  const bool wide = (all >> 32) != 0;
  // Everything that may throw comes before anything changes.
  std::unique_ptr<DigestTokens> list;
  for (std::size_t k = source.first_digest_at_or_after(begin); k < source.digests.size(); ++k) {
    if (source.digests[k].position >= end) break;
    if (list == nullptr) list = std::make_unique<DigestTokens>();
    list->push_back({source.digests[k].position - begin, source.digests[k].digest});
  }
  const std::size_t offset = list != nullptr ? sizeof(DigestTokens*) : 0;
  const std::size_t bytes = offset + n * (wide ? 8 : 4);  // < 2**30: a block holds at most 2**20 tokens
  std::unique_ptr<std::uint8_t[]> grown;
  if (bytes > capacity_) grown.reset(new std::uint8_t[bytes]);  // not zeroed: every byte is written below
  release_digests();
  if (grown != nullptr) {
    storage_ = std::move(grown);
    capacity_ = static_cast<std::uint32_t>(bytes);
  }
  if (list != nullptr) {
    const DigestTokens* owned = list.release();
    std::memcpy(storage_.get(), &owned, sizeof owned);
    digests_ = 1;
  }
  std::uint8_t* out = storage_.get() + offset;
  if (wide) {
    if (n > 0) std::memcpy(out, ids, n * 8);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const auto v = static_cast<std::uint32_t>(ids[i]);
      std::memcpy(out + 4 * i, &v, 4);
    }
  }
  size_ = static_cast<std::uint32_t>(n);
  wide_ = wide;
}

TokenList BlockTokens::to_list() const {
  TokenList out;
  out.ids.resize(size_);
  for (std::size_t i = 0; i < size_; ++i) out.ids[i] = raw(i);
  if (const DigestTokens* list = digest_list()) out.digests = *list;
  return out;
}

Tokens BlockTokens::view() const {
  Tokens t;
  t.data = ids();
  t.count = size_;
  t.width = wide_ ? 8 : 4;
  t.stride = t.width;
  t.is_signed = false;
  if (const DigestTokens* list = digest_list()) t.digests = *list;
  return t;
}

}  // namespace kvcore
