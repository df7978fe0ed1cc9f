#include "kvcore/block_tokens.h"

#include <algorithm>

namespace kvcore {

namespace {

std::uint8_t* heap_of(const std::uint8_t* area) noexcept {
  std::uint8_t* heap;
  std::memcpy(&heap, area, sizeof heap);
  return heap;
}

}  // namespace

const Digest* BlockTokens::digest_at(std::size_t i) const noexcept {
  if (digests_ == nullptr) return nullptr;
  const auto it = std::lower_bound(digests_->begin(), digests_->end(), i,
                                   [](const DigestToken& d, std::size_t pos) { return d.position < pos; });
  return it != digests_->end() && it->position == i ? &it->digest : nullptr;
}

TokenList BlockTokens::to_list() const {
  TokenList out;
  out.ids.resize(size_);
  for (std::size_t i = 0; i < size_; ++i) out.ids[i] = raw(i);
  if (digests_ != nullptr) out.digests = *digests_;
  return out;
}

Tokens BlockTokens::view() const {
  Tokens t;
  t.data = ids_;
  t.count = size_;
  t.width = wide_ ? 8 : 4;
  t.stride = t.width;
  t.is_signed = false;
  if (digests_ != nullptr) t.digests = *digests_;
  return t;
}

BlockTokens tokens_in(const std::uint8_t* area, TokenHeader header) noexcept {
  if (!header.heap) return {area, header.size, false, nullptr};
  const std::uint8_t* heap = heap_of(area);
  const DigestTokens* list = nullptr;
  if (header.digests) std::memcpy(&list, heap, sizeof list);
  return {heap + (header.digests ? sizeof list : 0), header.size, header.wide, list};
}

void release_tokens(std::uint8_t* area, TokenHeader header) noexcept {
  if (!header.heap) return;
  std::uint8_t* heap = heap_of(area);
  if (header.digests) {
    const DigestTokens* list;
    std::memcpy(&list, heap, sizeof list);
    delete list;
  }
  delete[] heap;
}

TokenHeader store_tokens(std::uint8_t* area, std::size_t area_bytes, TokenHeader old, const TokenList& source,
                         std::size_t begin, std::size_t end) {
  const std::size_t n = end - begin;
  const std::uint64_t* ids = source.ids.data() + begin;
  std::uint64_t all = 0;  // every id's bits: a loop without an exit vectorises
  for (std::size_t i = 0; i < n; ++i) all |= ids[i];
  TokenHeader header;
  header.size = static_cast<std::uint32_t>(n);
  header.wide = (all >> 32) != 0;
  // Everything that may throw comes before anything changes.
  std::unique_ptr<DigestTokens> list;
  for (std::size_t k = source.first_digest_at_or_after(begin); k < source.digests.size(); ++k) {
    if (source.digests[k].position >= end) break;
    if (list == nullptr) list = std::make_unique<DigestTokens>();
    list->push_back({source.digests[k].position - begin, source.digests[k].digest});
  }
  header.digests = list != nullptr;
  const std::size_t offset = header.digests ? sizeof(DigestTokens*) : 0;
  const std::size_t id_bytes = n * (header.wide ? 8 : 4);
  header.heap = header.digests || header.wide || id_bytes > area_bytes;
  std::unique_ptr<std::uint8_t[]> heap;
  if (header.heap) heap.reset(new std::uint8_t[offset + id_bytes]);  // not zeroed: every byte is written below
  release_tokens(area, old);
  std::uint8_t* out = area;
  if (header.heap) {
    std::uint8_t* owned = heap.release();
    std::memcpy(area, &owned, sizeof owned);
    if (list != nullptr) {
      const DigestTokens* owned_list = list.release();
      std::memcpy(owned, &owned_list, sizeof owned_list);
    }
    out = owned + offset;
  }
  if (header.wide) {
    if (n > 0) std::memcpy(out, ids, n * 8);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const auto v = static_cast<std::uint32_t>(ids[i]);
      std::memcpy(out + 4 * i, &v, 4);
    }
  }
  return header;
}

}  // namespace kvcore
