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
};

using R = Rounds<Armv8>;

KVCORE_INLINE uint32x4_t load_be(const std::uint8_t* p) { return Armv8::load_be(p); }

// Digest bytes are the big-endian state words.
KVCORE_INLINE void store_be(std::uint8_t* p, uint32x4_t v) { vst1q_u8(p, vrev32q_u8(vreinterpretq_u8_u32(v))); }

}  // namespace

void transform_armv8(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks) {
  // The instructions use the natural {a,b,c,d},{e,f,g,h} layout, so state is
  // loaded once and stays in registers across all blocks.
  uint32x4_t abcd = vld1q_u32(state);
  uint32x4_t efgh = vld1q_u32(state + 4);
  R::compress_blocks(abcd, efgh, data, blocks);
  vst1q_u32(state, abcd);
  vst1q_u32(state + 4, efgh);
}

void chain_armv8(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                 std::uint8_t* out) {
  detail::ChainPlan plan;
  detail::chain_plan_init(plan, len);
  const uint32x4_t iv_abcd = vld1q_u32(detail::kInitialHash);
  const uint32x4_t iv_efgh = vld1q_u32(detail::kInitialHash + 4);

  // Message words 0..7 of each key are the previous key's final state words
  // (natural layout here), carried in registers from key to key.
  uint32x4_t prev0 = load_be(parent);
  uint32x4_t prev1 = load_be(parent + 16);
  for (std::size_t i = 0; i < n; ++i, data += len, out += 32) {
    detail::copy_short(plan.buf, data + plan.copy_off, plan.copy_len);
    const std::uint8_t* hi = plan.hi_from_buf ? plan.buf : data;

    uint32x4_t abcd = iv_abcd;
    uint32x4_t efgh = iv_efgh;
    R::compress(abcd, efgh, prev0, prev1, load_be(hi), load_be(hi + 16));
    if (plan.mid_blocks != 0)
      R::compress_blocks(abcd, efgh, data + 32, plan.mid_blocks);  // data + 32 may be past the end
    R::compress_blocks(abcd, efgh, plan.buf + plan.tail_off, plan.tail_blocks);

    prev0 = abcd;
    prev1 = efgh;
    store_be(out, abcd);
    store_be(out + 16, efgh);
  }
}

void transform2_armv8(std::uint32_t state_a[8], const std::uint8_t* data_a, std::uint32_t state_b[8],
                      const std::uint8_t* data_b, std::size_t blocks) {
  R::Lane a, b;
  a.s0 = vld1q_u32(state_a);
  a.s1 = vld1q_u32(state_a + 4);
  b.s0 = vld1q_u32(state_b);
  b.s1 = vld1q_u32(state_b + 4);
  R::compress_blocks2(a, data_a, b, data_b, blocks);
  vst1q_u32(state_a, a.s0);
  vst1q_u32(state_a + 4, a.s1);
  vst1q_u32(state_b, b.s0);
  vst1q_u32(state_b + 4, b.s1);
}

// chain_armv8's loop with two chains in lock step. Both share len, so one plan
// shape serves both; each has its own tail buffer (different data bytes).
void chain2_armv8(const std::uint8_t parent_a[32], const std::uint8_t* data_a, std::uint8_t* out_a,
                  const std::uint8_t parent_b[32], const std::uint8_t* data_b, std::uint8_t* out_b, std::size_t len,
                  std::size_t n) {
  detail::ChainPlan plan_a, plan_b;
  detail::chain_plan_init(plan_a, len);
  detail::chain_plan_init(plan_b, len);
  const uint32x4_t iv_abcd = vld1q_u32(detail::kInitialHash);
  const uint32x4_t iv_efgh = vld1q_u32(detail::kInitialHash + 4);

  // Each chain's previous digest: message words 0..7 of its next key.
  uint32x4_t prev_a0 = load_be(parent_a), prev_a1 = load_be(parent_a + 16);
  uint32x4_t prev_b0 = load_be(parent_b), prev_b1 = load_be(parent_b + 16);
  const std::size_t mid = plan_a.mid_blocks, tail = plan_a.tail_blocks;
  for (std::size_t i = 0; i < n; ++i, data_a += len, data_b += len, out_a += 32, out_b += 32) {
    detail::copy_short(plan_a.buf, data_a + plan_a.copy_off, plan_a.copy_len);
    detail::copy_short(plan_b.buf, data_b + plan_b.copy_off, plan_b.copy_len);
    const std::uint8_t* hi_a = plan_a.hi_from_buf ? plan_a.buf : data_a;
    const std::uint8_t* hi_b = plan_b.hi_from_buf ? plan_b.buf : data_b;

    R::Lane a{iv_abcd, iv_efgh, prev_a0, prev_a1, load_be(hi_a), load_be(hi_a + 16)};
    R::Lane b{iv_abcd, iv_efgh, prev_b0, prev_b1, load_be(hi_b), load_be(hi_b + 16)};
    R::compress2(a, b);
    if (mid != 0) R::compress_blocks2(a, data_a + 32, b, data_b + 32, mid);  // data + 32 may be past the end
    R::compress_blocks2(a, plan_a.buf + plan_a.tail_off, b, plan_b.buf + plan_b.tail_off, tail);

    prev_a0 = a.s0;
    prev_a1 = a.s1;
    prev_b0 = b.s0;
    prev_b1 = b.s1;
    store_be(out_a, a.s0);
    store_be(out_a + 16, a.s1);
    store_be(out_b, b.s0);
    store_be(out_b + 16, b.s1);
  }
}

#undef KVCORE_INLINE

}  // namespace sha256
}  // namespace kvcore

#endif  // __aarch64__
