#include "kvcore/event_hash.h"

namespace kvcore {

std::uint64_t cache_salt_to_id(std::string_view utf8) noexcept {
  const Digest d = sha256_digest(reinterpret_cast<const std::uint8_t*>(utf8.data()), utf8.size());
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | d[i];
  return v;
}

std::string block_hash_v2_sha256(const Digest& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (std::size_t i = 0; i < key.size(); ++i) {
    out[2 * i] = kHex[key[i] >> 4];
    out[2 * i + 1] = kHex[key[i] & 15];
  }
  return out;
}

std::uint64_t block_hash_v2_sha256_64(const Digest& key) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | key[i];
  return v;
}

namespace {

std::uint64_t mix32(std::uint64_t value, std::uint64_t seed) noexcept {
  std::uint32_t v = static_cast<std::uint32_t>(value);
  v = ((v >> 16) ^ v) * 0x45D9F3Bu;
  v = ((v >> 16) ^ v) * 0x45D9F3Bu;
  v = ((v >> 16) ^ v) + 0x9E3779B9u;  // wraps at 2**32, as the legacy hash did
  return seed ^ (v + (seed << 6) + (seed >> 2));
}

std::uint64_t mix64(std::uint64_t v, std::uint64_t seed) noexcept {
  v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
  v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
  v ^= v >> 31;
  return seed ^ (v + 0x9E3779B9ull + (seed << 6) + (seed >> 2));
}

}  // namespace

std::uint64_t block_hash_v1(const Tokens& tokens, std::uint64_t parent_hash, const ReuseScope& scope) noexcept {
  std::uint64_t seed = static_cast<std::uint64_t>(tokens.count) ^ (parent_hash * 0xBF58476D1CE4E5B9ull);
  if (parent_hash == 0 && scope.salt) seed = mix64(*scope.salt, seed);
  for (std::size_t i = 0; i < tokens.count; ++i) seed = mix32(tokens.raw(i), seed);
  if (scope.lora_id) seed = mix64(*scope.lora_id, seed);
  return seed;
}

}  // namespace kvcore
