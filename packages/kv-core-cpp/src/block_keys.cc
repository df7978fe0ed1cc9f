#include "kvcore/block_keys.h"

#include <cstring>
#include <utility>

namespace kvcore {

std::vector<std::uint8_t> reuse_scope_bytes(const ReuseScope& scope) {
  std::vector<std::uint8_t> out{static_cast<std::uint8_t>((scope.lora_id ? 1 : 0) | (scope.salt ? 2 : 0))};
  for (const auto& field : {scope.lora_id, scope.salt}) {
    if (!field) continue;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(*field >> (8 * i)));
  }
  return out;
}

Digest root_key(const ReuseScope& scope) {
  const std::vector<std::uint8_t> bytes = reuse_scope_bytes(scope);
  return sha256_digest(bytes.data(), bytes.size());
}

void block_keys(std::size_t tokens_per_block, const ReuseScope& scope, const Tokens& tokens, KeyFormat format,
                std::uint8_t* out) noexcept {
  Digest key = root_key(scope);
  std::memcpy(out, key.data(), key.size());
  out += key.size();
  Hasher hasher(format);
  std::size_t digest = 0;
  for (std::size_t begin = 0; begin < tokens.count; begin += tokens_per_block) {
    const std::size_t end = tokens.count - begin < tokens_per_block ? tokens.count : begin + tokens_per_block;
    hasher.begin(key);
    hasher.write(tokens, begin, end, digest);
    key = hasher.finish();
    std::memcpy(out, key.data(), key.size());
    out += key.size();
  }
}

BlockKeyIterator::BlockKeyIterator(std::size_t tokens_per_block, const ReuseScope& scope, Tokens tokens,
                                   KeyFormat format)
    : tokens_per_block_(tokens_per_block), tokens_(std::move(tokens)), hasher_(format), key_(root_key(scope)) {}

Digest BlockKeyIterator::next(std::size_t& begin, std::size_t& end) noexcept {
  begin = end = next_;
  if (!started_) {
    started_ = true;
    return key_;
  }
  end = tokens_.count - begin < tokens_per_block_ ? tokens_.count : begin + tokens_per_block_;
  hasher_.begin(key_);
  hasher_.write(tokens_, begin, end, digest_);
  key_ = hasher_.finish();
  next_ = end;
  return key_;
}

}  // namespace kvcore
