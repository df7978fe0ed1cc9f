// ARMv8 crypto-extension SHA-256 block transform. Built with
// -march=armv8-a+crypto for this TU only; sha256.cc calls it only after
// HWCAP reports SHA2.

#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>

#include "sha256_rounds.h"
#include "sha256_transforms.h"

namespace kvcore {
namespace sha256 {
namespace {

#define KVCORE_INLINE inline __attribute__((always_inline))

// The ARMv8 operations sha256_rounds.h builds the compression from; the state is in the natural
// {a,b,c,d},{e,f,g,h} layout.
struct Armv8 {
  using Vec = uint32x4_t;

  // SHA256H needs the pre-round ABCD to feed SHA256H2, so keep a copy. Each SHA256H/H2 pair
  // performs four rounds with W+K in one vector.
  KVCORE_INLINE static void four_rounds(uint32x4_t& abcd, uint32x4_t& efgh, uint32x4_t w, int t) {
    const uint32x4_t wk = vaddq_u32(w, vld1q_u32(detail::kRoundConstants + t));
    const uint32x4_t abcd_in = abcd;
    abcd = vsha256hq_u32(abcd, efgh, wk);
    efgh = vsha256h2q_u32(efgh, abcd_in, wk);
  }

  // W[t..t+3] from the previous 16 words (w0 oldest): SU0 adds the sigma0 terms, SU1 the
  // W[t-7] and sigma1 terms.
  KVCORE_INLINE static uint32x4_t schedule(uint32x4_t w0, uint32x4_t w1, uint32x4_t w2, uint32x4_t w3) {
    return vsha256su1q_u32(vsha256su0q_u32(w0, w1), w2, w3);
  }

  // Message words are big-endian; the target is little-endian.
  KVCORE_INLINE static uint32x4_t load_be(const std::uint8_t* p) {
    return vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(p)));
  }

  KVCORE_INLINE static uint32x4_t add(uint32x4_t a, uint32x4_t b) { return vaddq_u32(a, b); }

  // Digest bytes are the big-endian state words.
  KVCORE_INLINE static void store_be(std::uint8_t* p, uint32x4_t v) {
    vst1q_u8(p, vrev32q_u8(vreinterpretq_u8_u32(v)));
  }

  // The instructions use the natural {a,b,c,d},{e,f,g,h} layout: no conversions.
  KVCORE_INLINE static void initial(uint32x4_t& abcd, uint32x4_t& efgh) {
    abcd = vld1q_u32(detail::kInitialHash);
    efgh = vld1q_u32(detail::kInitialHash + 4);
  }

  KVCORE_INLINE static void load_state(const std::uint32_t state[8], uint32x4_t& abcd, uint32x4_t& efgh) {
    abcd = vld1q_u32(state);
    efgh = vld1q_u32(state + 4);
  }

  KVCORE_INLINE static void store_state(std::uint32_t state[8], uint32x4_t abcd, uint32x4_t efgh) {
    vst1q_u32(state, abcd);
    vst1q_u32(state + 4, efgh);
  }

  KVCORE_INLINE static void digest_words(uint32x4_t abcd, uint32x4_t efgh, uint32x4_t& w0, uint32x4_t& w1) {
    w0 = abcd;
    w1 = efgh;
  }
};

using R = Rounds<Armv8>;

#undef KVCORE_INLINE

}  // namespace

KVCORE_SHA256_KERNELS(armv8, R)

}  // namespace sha256
}  // namespace kvcore

#endif  // __aarch64__
