// SHA-256 (FIPS 180-4) with runtime selection between a portable scalar
// transform and hardware transforms (x86 SHA-NI, ARMv8 crypto extensions).
//
// Threads: the active transform is chosen under a mutex of its own and published through an
// atomic, so active(), select() and the hash functions may run on any thread without the
// manager's lock; every transform computes the same digests, so a select() while others hash
// changes no result. A Sha256 object is one stream's state: one thread's at a time.
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

// One stream of an interleaved compression: `blocks` blocks of data compressed into state.
struct Stream {
  std::uint32_t* state;
  const std::uint8_t* data;
};

// Independent streams interleaved (2 or 4, by the Transform field), so the rounds of one fill
// the others' latency: each stream exactly as TransformFn would compress it.
using TransformNFn = void (*)(const Stream streams[], std::size_t blocks);

// One chain of an interleaved ChainFn: n keys chained from parent over data, written to out.
// parent may alias its own chain's out (it is read first), never another chain's.
struct Chain {
  const std::uint8_t* parent;
  const std::uint8_t* data;
  std::uint8_t* out;
};

// Independent chains of ChainFn interleaved (2 or 4): n keys of each, every message len bytes.
using ChainNFn = void (*)(const Chain chains[], std::size_t len, std::size_t n);

struct Transform {
  const char* name;
  TransformFn fn;
  ChainFn chain;     // fused chain of keys; keeps the state in registers across keys
  TransformNFn fn2;  // 2 streams
  ChainNFn chain2;
  TransformNFn fn4;  // 4 streams
  ChainNFn chain4;
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

// Two or four chains at once with the active transform (see ChainNFn).
void chain_keys2(const Chain chains[2], std::size_t len, std::size_t n) noexcept;
void chain_keys4(const Chain chains[4], std::size_t len, std::size_t n) noexcept;

}  // namespace sha256

// Streaming hasher; it keeps the transform active when it was built.
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
