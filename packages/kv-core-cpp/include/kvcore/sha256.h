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

struct Transform {
  const char* name;
  TransformFn fn;
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
