// ARMv8 crypto-extension SHA-256 block transform. Built with
// -march=armv8-a+crypto for this TU only; sha256.cc calls it only after
// HWCAP reports SHA2.

#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>

#include "sha256_transforms.h"

namespace kvcore {
namespace sha256 {
namespace {

#define KVCORE_INLINE inline __attribute__((always_inline))

// SHA256H needs the pre-round ABCD to feed SHA256H2, so keep a copy. Each
// SHA256H/H2 pair performs four rounds with W+K in one vector.
KVCORE_INLINE void four_rounds(uint32x4_t& abcd, uint32x4_t& efgh, uint32x4_t w, int t) {
  const uint32x4_t wk = vaddq_u32(w, vld1q_u32(detail::kRoundConstants + t));
  const uint32x4_t abcd_in = abcd;
  abcd = vsha256hq_u32(abcd, efgh, wk);
  efgh = vsha256h2q_u32(efgh, abcd_in, wk);
}

// W[t..t+3] from the previous 16 words (w0 oldest): SU0 adds the sigma0
// terms, SU1 the W[t-7] and sigma1 terms.
KVCORE_INLINE uint32x4_t schedule(uint32x4_t w0, uint32x4_t w1, uint32x4_t w2, uint32x4_t w3) {
  return vsha256su1q_u32(vsha256su0q_u32(w0, w1), w2, w3);
}

// Message words are big-endian; the target is little-endian.
KVCORE_INLINE uint32x4_t load_be(const std::uint8_t* p) { return vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p))); }

}  // namespace

void transform_armv8(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks) {
  // The instructions use the natural {a,b,c,d},{e,f,g,h} layout, so state is
  // loaded once and stays in registers across all blocks.
  uint32x4_t abcd = vld1q_u32(state);
  uint32x4_t efgh = vld1q_u32(state + 4);

  for (; blocks != 0; --blocks, data += 64) {
    const uint32x4_t abcd_in = abcd;
    const uint32x4_t efgh_in = efgh;
    uint32x4_t w0 = load_be(data);
    uint32x4_t w1 = load_be(data + 16);
    uint32x4_t w2 = load_be(data + 32);
    uint32x4_t w3 = load_be(data + 48);

    four_rounds(abcd, efgh, w0, 0);
    four_rounds(abcd, efgh, w1, 4);
    four_rounds(abcd, efgh, w2, 8);
    four_rounds(abcd, efgh, w3, 12);
    w0 = schedule(w0, w1, w2, w3);
    four_rounds(abcd, efgh, w0, 16);
    w1 = schedule(w1, w2, w3, w0);
    four_rounds(abcd, efgh, w1, 20);
    w2 = schedule(w2, w3, w0, w1);
    four_rounds(abcd, efgh, w2, 24);
    w3 = schedule(w3, w0, w1, w2);
    four_rounds(abcd, efgh, w3, 28);
    w0 = schedule(w0, w1, w2, w3);
    four_rounds(abcd, efgh, w0, 32);
    w1 = schedule(w1, w2, w3, w0);
    four_rounds(abcd, efgh, w1, 36);
    w2 = schedule(w2, w3, w0, w1);
    four_rounds(abcd, efgh, w2, 40);
    w3 = schedule(w3, w0, w1, w2);
    four_rounds(abcd, efgh, w3, 44);
    w0 = schedule(w0, w1, w2, w3);
    four_rounds(abcd, efgh, w0, 48);
    w1 = schedule(w1, w2, w3, w0);
    four_rounds(abcd, efgh, w1, 52);
    w2 = schedule(w2, w3, w0, w1);
    four_rounds(abcd, efgh, w2, 56);
    w3 = schedule(w3, w0, w1, w2);
    four_rounds(abcd, efgh, w3, 60);

    abcd = vaddq_u32(abcd, abcd_in);
    efgh = vaddq_u32(efgh, efgh_in);
  }

  vst1q_u32(state, abcd);
  vst1q_u32(state + 4, efgh);
}

#undef KVCORE_INLINE

}  // namespace sha256
}  // namespace kvcore

#endif  // __aarch64__
