// SHA-256 (FIPS 180-4) with runtime selection between a portable scalar
// transform and hardware transforms (x86 SHA-NI, ARMv8 crypto extensions).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcore {

using Digest = std::array<std::uint8_t, 32>;

namespace sha256 {

// Compresses `blocks` consecutive 64-byte blocks into `state` (8 words, FIPS 180-4 H0..H7).
using TransformFn = void (*)(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks);

// Computes n chained keys over uniform messages: key[i] = SHA-256(key[i-1] || data[i*len, (i+1)*len)),
// key[-1] = parent; writes key[i] to out + 32*i. data is read in place (any alignment); len >= 1.
using ChainFn = void (*)(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                         std::uint8_t* out);

// Two independent streams interleaved: compresses `blocks` blocks of `data_a` into `state_a`
// and as many of `data_b` into `state_b`, so one stream's rounds fill the other's latency.
using TransformFn2 = void (*)(std::uint32_t state_a[8], const std::uint8_t* data_a, std::uint32_t state_b[8],
                              const std::uint8_t* data_b, std::size_t blocks);

// Two independent chains of ChainFn, interleaved: n keys of each, every message len bytes.
// Each parent may alias its own out, never the other chain's.
using ChainFn2 = void (*)(const std::uint8_t parent_a[32], const std::uint8_t* data_a, std::uint8_t* out_a,
                          const std::uint8_t parent_b[32], const std::uint8_t* data_b, std::uint8_t* out_b,
                          std::size_t len, std::size_t n);

struct Transform {
  const char* name;
  TransformFn fn;
  ChainFn chain;  // fused chain of keys; keeps the state in registers across keys
  TransformFn2 fn2;
  ChainFn2 chain2;
};

// Transforms compiled in AND supported by this CPU; "portable" first, then "shani"/"armv8".
std::vector<std::string> available();

// Selected once on first call (thread-safe): env KVCORE_SHA256 if set, else the
// best available. The chosen transform passes a known-answer self-test first
// (also in release builds). Throws std::invalid_argument if KVCORE_SHA256 names
// a transform that is unknown or unavailable here.
const Transform& active();

// Forces one transform ("portable" | "shani" | "armv8"). Throws
// std::invalid_argument (message lists available()) if the name is unknown,
// not compiled in, or not supported by the CPU. Sha256 objects created
// afterwards use the new transform; existing ones keep theirs.
void select(const std::string& name);

// Chained block keys with the active transform (see ChainFn). parent is read
// before anything is written, so it may alias out.
void chain_keys(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                std::uint8_t* out) noexcept;

// Two chains at once with the active transform (see ChainFn2).
void chain_keys2(const std::uint8_t parent_a[32], const std::uint8_t* data_a, std::uint8_t* out_a,
                 const std::uint8_t parent_b[32], const std::uint8_t* data_b, std::uint8_t* out_b, std::size_t len,
                 std::size_t n) noexcept;

}  // namespace sha256

// Streaming hasher.
class Sha256 {
 public:
  Sha256() noexcept;  // captures active().fn
  void write(const std::uint8_t* data, std::size_t len) noexcept;
  Digest finish() noexcept;  // pads and returns the digest; call reset() before reusing
  void reset() noexcept;

 private:
  sha256::TransformFn fn_;
  std::uint32_t state_[8];
  std::uint8_t buf_[64];
  std::size_t buf_len_;
  std::uint64_t total_len_;  // bytes written so far; the padding encodes it in bits
};

Digest sha256_digest(const std::uint8_t* data, std::size_t len) noexcept;

}  // namespace kvcore
