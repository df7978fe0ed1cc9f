// Portable scalar SHA-256 block transform (FIPS 180-4 section 6.2.2).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "sha256_transforms.h"

namespace kvcore {
namespace sha256 {
namespace {

inline std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// Big-endian load by bytes: correct on any alignment and compiles to a
// single load + bswap on the targets we build for.
inline std::uint32_t load_be32(const std::uint8_t* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | std::uint32_t(p[3]);
}

inline std::uint32_t big_sigma0(std::uint32_t x) { return rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22); }
inline std::uint32_t big_sigma1(std::uint32_t x) { return rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25); }
inline std::uint32_t small_sigma0(std::uint32_t x) { return rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3); }
inline std::uint32_t small_sigma1(std::uint32_t x) { return rotr(x, 17) ^ rotr(x, 19) ^ (x >> 10); }

// One round. Instead of shifting all eight working variables, callers rotate
// the argument order, so each round only writes d and h (the compiler then
// keeps everything in registers with no moves).
inline void round(std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t& d, std::uint32_t e, std::uint32_t f,
                  std::uint32_t g, std::uint32_t& h, std::uint32_t kw) {
  const std::uint32_t t1 = h + big_sigma1(e) + ((e & f) ^ (~e & g)) + kw;
  const std::uint32_t t2 = big_sigma0(a) + ((a & b) ^ (a & c) ^ (b & c));
  d += t1;
  h = t1 + t2;
}

// W[t] for t >= 16, computed in place in a 16-word ring (saves stack versus a
// 64-word schedule).
inline std::uint32_t expand(std::uint32_t w[16], int t) {
  w[t & 15] += small_sigma1(w[(t - 2) & 15]) + w[(t - 7) & 15] + small_sigma0(w[(t - 15) & 15]);
  return w[t & 15];
}

// Eight rounds starting at round t; kExpand selects taking W straight from
// the block (t < 16) or expanding the schedule.
template <bool kExpand>
inline void eight_rounds(std::uint32_t& a, std::uint32_t& b, std::uint32_t& c, std::uint32_t& d, std::uint32_t& e,
                         std::uint32_t& f, std::uint32_t& g, std::uint32_t& h, std::uint32_t w[16], int t) {
  const std::uint32_t* k = detail::kRoundConstants;
  auto W = [&](int i) { return kExpand ? expand(w, i) : w[i & 15]; };
  round(a, b, c, d, e, f, g, h, k[t + 0] + W(t + 0));
  round(h, a, b, c, d, e, f, g, k[t + 1] + W(t + 1));
  round(g, h, a, b, c, d, e, f, k[t + 2] + W(t + 2));
  round(f, g, h, a, b, c, d, e, k[t + 3] + W(t + 3));
  round(e, f, g, h, a, b, c, d, k[t + 4] + W(t + 4));
  round(d, e, f, g, h, a, b, c, k[t + 5] + W(t + 5));
  round(c, d, e, f, g, h, a, b, k[t + 6] + W(t + 6));
  round(b, c, d, e, f, g, h, a, k[t + 7] + W(t + 7));
}

}  // namespace

void transform_portable(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks) {
  // Working state lives in locals across all blocks; written back once.
  std::uint32_t h0 = state[0], h1 = state[1], h2 = state[2], h3 = state[3];
  std::uint32_t h4 = state[4], h5 = state[5], h6 = state[6], h7 = state[7];
  for (; blocks != 0; --blocks, data += 64) {
    std::uint32_t w[16];
    for (int i = 0; i < 16; ++i) w[i] = load_be32(data + 4 * i);

    std::uint32_t a = h0, b = h1, c = h2, d = h3, e = h4, f = h5, g = h6, h = h7;
    eight_rounds<false>(a, b, c, d, e, f, g, h, w, 0);
    eight_rounds<false>(a, b, c, d, e, f, g, h, w, 8);
    for (int t = 16; t < 64; t += 8) eight_rounds<true>(a, b, c, d, e, f, g, h, w, t);

    h0 += a;
    h1 += b;
    h2 += c;
    h3 += d;
    h4 += e;
    h5 += f;
    h6 += g;
    h7 += h;
  }
  state[0] = h0;
  state[1] = h1;
  state[2] = h2;
  state[3] = h3;
  state[4] = h4;
  state[5] = h5;
  state[6] = h6;
  state[7] = h7;
}

void chain_portable(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                    std::uint8_t* out) {
  // Scalar compression dominates here, so blocks are simply assembled in
  // memory and fed to the block transform.
  detail::ChainPlan plan;
  detail::chain_plan_init(plan, len);
  std::uint8_t block0[64];
  std::memcpy(block0, parent, 32);  // before any write to out (parent may alias it)
  for (std::size_t i = 0; i < n; ++i, data += len, out += 32) {
    detail::copy_short(plan.buf, data + plan.copy_off, plan.copy_len);
    std::memcpy(block0 + 32, plan.hi_from_buf ? plan.buf : data, 32);

    std::uint32_t st[8];
    std::memcpy(st, detail::kInitialHash, sizeof st);
    transform_portable(st, block0, 1);
    if (plan.mid_blocks != 0) transform_portable(st, data + 32, plan.mid_blocks);  // data + 32 may be past the end
    transform_portable(st, plan.buf + plan.tail_off, plan.tail_blocks);

    // The digest is the next key's parent: it goes straight into block0.
    for (int w = 0; w < 8; ++w)
      for (int b = 0; b < 4; ++b) block0[4 * w + b] = static_cast<std::uint8_t>(st[w] >> (24 - 8 * b));
    std::memcpy(out, block0, 32);
  }
}

// The scalar rounds already keep the integer units busy with one stream, so the interleaved
// forms are plain loops over the streams.
void transform2_portable(const Stream streams[2], std::size_t blocks) {
  for (int i = 0; i < 2; ++i) transform_portable(streams[i].state, streams[i].data, blocks);
}

void transform4_portable(const Stream streams[4], std::size_t blocks) {
  for (int i = 0; i < 4; ++i) transform_portable(streams[i].state, streams[i].data, blocks);
}

void chain2_portable(const Chain chains[2], std::size_t len, std::size_t n) {
  for (int i = 0; i < 2; ++i) chain_portable(chains[i].parent, chains[i].data, len, n, chains[i].out);
}

void chain4_portable(const Chain chains[4], std::size_t len, std::size_t n) {
  for (int i = 0; i < 4; ++i) chain_portable(chains[i].parent, chains[i].data, len, n, chains[i].out);
}

}  // namespace sha256
}  // namespace kvcore
