// The forms a block key takes in KV-cache events, and the salt id of a tenant's cache salt;
// mirrors event_hash.py. Pure functions: any thread, no lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvcore/block_keys.h"

namespace kvcore {

// First 8 bytes of SHA-256(utf8) read little-endian: the ReuseScope salt of a cache_salt.
std::uint64_t cache_salt_to_id(std::string_view utf8) noexcept;
// v2_sha256: the key as 64 lowercase hex characters.
std::string block_hash_v2_sha256(const Digest& key);
// v2_sha256_64: the first 8 key bytes read big-endian (unlike the salt id).
std::uint64_t block_hash_v2_sha256_64(const Digest& key) noexcept;
// v1_block_key: the legacy 64-bit mix of a block of int ids under its parent's v1 hash.
std::uint64_t block_hash_v1(const Tokens& tokens, std::uint64_t parent_hash, const ReuseScope& scope) noexcept;

}  // namespace kvcore
