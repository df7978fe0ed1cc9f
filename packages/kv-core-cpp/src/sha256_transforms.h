// Internal: the SHA-256 block transforms. Each has the signature of
// kvcore::sha256::TransformFn. Only the ones CMake compiled (KVCORE_HAVE_*)
// may be referenced, and only after checking CPU support.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvcore/sha256.h"

namespace kvcore {
namespace sha256 {
namespace detail {

// FIPS 180-4 section 4.2.2 round constants. Aligned so the SIMD transforms can
// use aligned 128-bit loads of four constants at a time.
alignas(16) inline constexpr std::uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// FIPS 180-4 section 5.3.3 initial hash value.
alignas(16) inline constexpr std::uint32_t kInitialHash[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

// How one key of a chain (message = 32-byte parent || len data bytes) splits
// into blocks. Every key of a chain has the same len, so this is computed once
// per chain and only the data bytes of the last partial block change per key.
//
// Block 0 is parent (message words 0..7, taken from the previous state) plus
// 32 more bytes ("hi"): straight from data when len >= 32, else from buf.
// Then mid_blocks whole blocks straight from data + 32, then tail_blocks
// blocks from buf + tail_off. buf already holds the padding (0x80, zeros,
// big-endian bit length); per key, copy_len bytes from data + copy_off are
// copied to buf[0..copy_len) in front of the 0x80.
struct ChainPlan {
  bool hi_from_buf;
  std::size_t mid_blocks;
  std::size_t copy_off;
  std::size_t copy_len;
  std::size_t tail_off;
  std::size_t tail_blocks;
  alignas(16) std::uint8_t buf[128];
};

// Helpers below are static: this header is also compiled into the SIMD TUs
// with extra ISA flags, and a shared inline (COMDAT) copy built there could be
// picked by the linker for callers on CPUs without those instructions.
static inline void chain_plan_init(ChainPlan& p, std::size_t len) {
  const std::uint64_t total = 32 + static_cast<std::uint64_t>(len);  // message bytes per key
  std::memset(p.buf, 0, sizeof p.buf);
  std::size_t len_at;  // buf offset of the 8-byte bit length
  if (len < 32) {
    // Whole message fits in block 0; buf[0..32) is block 0's second half and
    // buf[32..96) the extra block needed when the length does not fit.
    p.hi_from_buf = true;
    p.mid_blocks = 0;
    p.copy_off = 0;
    p.copy_len = len;
    p.tail_off = 32;
    p.tail_blocks = total <= 55 ? 0 : 1;
    len_at = total <= 55 ? 24 : 88;
  } else {
    const std::size_t r = static_cast<std::size_t>(total % 64);  // bytes in the last partial block
    p.hi_from_buf = false;
    p.mid_blocks = static_cast<std::size_t>(total / 64) - 1;
    p.copy_off = 32 + 64 * p.mid_blocks;
    p.copy_len = r;
    p.tail_off = 0;
    p.tail_blocks = r <= 55 ? 1 : 2;
    len_at = 64 * p.tail_blocks - 8;
  }
  p.buf[p.copy_len] = 0x80;
  const std::uint64_t bits = total * 8;
  for (int i = 0; i < 8; ++i) p.buf[len_at + i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
}

// Copies n < 64 bytes with fixed-size (possibly overlapping) moves. A libc
// memcpy call would clobber every vector register, pushing the chained state
// out to the stack once per key; n is the same for every key of a chain, so
// the branches predict perfectly.
static inline void copy_short(std::uint8_t* dst, const std::uint8_t* src, std::size_t n) {
  if (n >= 16) {
    std::memcpy(dst, src, 16);
    if (n > 32) std::memcpy(dst + 16, src + 16, 16);
    if (n > 48) std::memcpy(dst + 32, src + 32, 16);
    std::memcpy(dst + n - 16, src + n - 16, 16);
  } else if (n >= 8) {
    std::memcpy(dst, src, 8);
    std::memcpy(dst + n - 8, src + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(dst, src, 4);
    std::memcpy(dst + n - 4, src + n - 4, 4);
  } else if (n >= 2) {
    std::memcpy(dst, src, 2);
    std::memcpy(dst + n - 2, src + n - 2, 2);
  } else if (n == 1) {
    dst[0] = src[0];
  }
}

}  // namespace detail

// Chain functions have the signature of kvcore::sha256::ChainFn; the *2 and *4 ones those of
// TransformNFn / ChainNFn (independent streams interleaved).
void transform_portable(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks);
void chain_portable(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                    std::uint8_t* out);
void transform2_portable(const Stream streams[2], std::size_t blocks);
void transform4_portable(const Stream streams[4], std::size_t blocks);
void chain2_portable(const Chain chains[2], std::size_t len, std::size_t n);
void chain4_portable(const Chain chains[4], std::size_t len, std::size_t n);
#if defined(KVCORE_HAVE_SHANI)
void transform_shani(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks);
void chain_shani(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                 std::uint8_t* out);
void transform2_shani(const Stream streams[2], std::size_t blocks);
void transform4_shani(const Stream streams[4], std::size_t blocks);
void chain2_shani(const Chain chains[2], std::size_t len, std::size_t n);
void chain4_shani(const Chain chains[4], std::size_t len, std::size_t n);
#endif
#if defined(KVCORE_HAVE_ARMV8)
void transform_armv8(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks);
void chain_armv8(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                 std::uint8_t* out);
void transform2_armv8(const Stream streams[2], std::size_t blocks);
void transform4_armv8(const Stream streams[4], std::size_t blocks);
void chain2_armv8(const Chain chains[2], std::size_t len, std::size_t n);
void chain4_armv8(const Chain chains[4], std::size_t len, std::size_t n);
#endif

}  // namespace sha256
}  // namespace kvcore
