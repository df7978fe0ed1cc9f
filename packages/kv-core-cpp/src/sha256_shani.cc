// x86 SHA-NI SHA-256 block transform. Built with -msha -msse4.1 for this TU
// only; sha256.cc calls it only after CPUID reports SHA and SSE4.1.

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "sha256_transforms.h"

namespace kvcore {
namespace sha256 {
namespace {

#define KVCORE_INLINE inline __attribute__((always_inline))

// SHA256RNDS2 works on the state split as ABEF / CDGH (A in the top lane).
// Each call does two rounds using the low two dwords of `wk` (W+K), so four
// rounds are two calls with the high half shuffled down in between. After the
// pair, the register roles are back where they started: the first call's
// result is the new ABEF, and the old ABEF becomes the new CDGH.
KVCORE_INLINE void four_rounds(__m128i& abef, __m128i& cdgh, __m128i w, int t) {
  __m128i wk = _mm_add_epi32(w, _mm_load_si128(reinterpret_cast<const __m128i*>(detail::kRoundConstants + t)));
  cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
  wk = _mm_shuffle_epi32(wk, 0x0E);
  abef = _mm_sha256rnds2_epu32(abef, cdgh, wk);
}

// W[t..t+3] from the previous 16 words (w0 oldest). MSG1 adds sigma0 of
// W[t-15..t-12] to W[t-16..t-13]; we add W[t-7..t-4] (an alignr of w2:w3);
// MSG2 then adds sigma1 terms, including the ones depending on its own output.
KVCORE_INLINE __m128i schedule(__m128i w0, __m128i w1, __m128i w2, __m128i w3) {
  __m128i x = _mm_sha256msg1_epu32(w0, w1);
  x = _mm_add_epi32(x, _mm_alignr_epi8(w3, w2, 4));
  return _mm_sha256msg2_epu32(x, w3);
}

// Byte-swaps each 32-bit lane: message words and digests are big-endian.
KVCORE_INLINE __m128i bswap_mask() { return _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL); }

KVCORE_INLINE __m128i load_be(const std::uint8_t* p) {
  return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), bswap_mask());
}

// One block: 64 rounds on message words W0..W15 (lanes 0..3 of w0 = W0..W3,
// and so on) plus the feed-forward addition.
KVCORE_INLINE void compress(__m128i& abef, __m128i& cdgh, __m128i w0, __m128i w1, __m128i w2, __m128i w3) {
  const __m128i abef_in = abef;
  const __m128i cdgh_in = cdgh;
  four_rounds(abef, cdgh, w0, 0);
  four_rounds(abef, cdgh, w1, 4);
  four_rounds(abef, cdgh, w2, 8);
  four_rounds(abef, cdgh, w3, 12);
  // Fully unrolled so the schedule for the next quad overlaps the
  // latency-bound RNDS2 chain of the current one.
  w0 = schedule(w0, w1, w2, w3);
  four_rounds(abef, cdgh, w0, 16);
  w1 = schedule(w1, w2, w3, w0);
  four_rounds(abef, cdgh, w1, 20);
  w2 = schedule(w2, w3, w0, w1);
  four_rounds(abef, cdgh, w2, 24);
  w3 = schedule(w3, w0, w1, w2);
  four_rounds(abef, cdgh, w3, 28);
  w0 = schedule(w0, w1, w2, w3);
  four_rounds(abef, cdgh, w0, 32);
  w1 = schedule(w1, w2, w3, w0);
  four_rounds(abef, cdgh, w1, 36);
  w2 = schedule(w2, w3, w0, w1);
  four_rounds(abef, cdgh, w2, 40);
  w3 = schedule(w3, w0, w1, w2);
  four_rounds(abef, cdgh, w3, 44);
  w0 = schedule(w0, w1, w2, w3);
  four_rounds(abef, cdgh, w0, 48);
  w1 = schedule(w1, w2, w3, w0);
  four_rounds(abef, cdgh, w1, 52);
  w2 = schedule(w2, w3, w0, w1);
  four_rounds(abef, cdgh, w2, 56);
  w3 = schedule(w3, w0, w1, w2);
  four_rounds(abef, cdgh, w3, 60);
  abef = _mm_add_epi32(abef, abef_in);
  cdgh = _mm_add_epi32(cdgh, cdgh_in);
}

// One stream's state and message schedule, for the 2-way kernels.
struct Lane {
  __m128i abef, cdgh;
  __m128i w0, w1, w2, w3;
};

// Rounds t..t+15 of both lanes, the two streams alternating quad by quad: the
// RNDS2 chain of each stream is latency-bound, so the other's instructions
// issue in its gaps. kSchedule: expand W first (t >= 16).
template <bool kSchedule>
KVCORE_INLINE void sixteen_rounds2(Lane& a, Lane& b, int t) {
  if (kSchedule) {
    a.w0 = schedule(a.w0, a.w1, a.w2, a.w3);
    b.w0 = schedule(b.w0, b.w1, b.w2, b.w3);
  }
  four_rounds(a.abef, a.cdgh, a.w0, t);
  four_rounds(b.abef, b.cdgh, b.w0, t);
  if (kSchedule) {
    a.w1 = schedule(a.w1, a.w2, a.w3, a.w0);
    b.w1 = schedule(b.w1, b.w2, b.w3, b.w0);
  }
  four_rounds(a.abef, a.cdgh, a.w1, t + 4);
  four_rounds(b.abef, b.cdgh, b.w1, t + 4);
  if (kSchedule) {
    a.w2 = schedule(a.w2, a.w3, a.w0, a.w1);
    b.w2 = schedule(b.w2, b.w3, b.w0, b.w1);
  }
  four_rounds(a.abef, a.cdgh, a.w2, t + 8);
  four_rounds(b.abef, b.cdgh, b.w2, t + 8);
  if (kSchedule) {
    a.w3 = schedule(a.w3, a.w0, a.w1, a.w2);
    b.w3 = schedule(b.w3, b.w0, b.w1, b.w2);
  }
  four_rounds(a.abef, a.cdgh, a.w3, t + 12);
  four_rounds(b.abef, b.cdgh, b.w3, t + 12);
}

// One block of each lane (message words already in w0..w3) plus feed-forward.
KVCORE_INLINE void compress2(Lane& a, Lane& b) {
  const __m128i a_abef = a.abef, a_cdgh = a.cdgh, b_abef = b.abef, b_cdgh = b.cdgh;
  sixteen_rounds2<false>(a, b, 0);
  sixteen_rounds2<true>(a, b, 16);
  sixteen_rounds2<true>(a, b, 32);
  sixteen_rounds2<true>(a, b, 48);
  a.abef = _mm_add_epi32(a.abef, a_abef);
  a.cdgh = _mm_add_epi32(a.cdgh, a_cdgh);
  b.abef = _mm_add_epi32(b.abef, b_abef);
  b.cdgh = _mm_add_epi32(b.cdgh, b_cdgh);
}

KVCORE_INLINE void load_block(Lane& l, const std::uint8_t* p) {
  l.w0 = load_be(p);
  l.w1 = load_be(p + 16);
  l.w2 = load_be(p + 32);
  l.w3 = load_be(p + 48);
}

KVCORE_INLINE void compress_blocks2(Lane& a, const std::uint8_t* pa, Lane& b, const std::uint8_t* pb,
                                    std::size_t blocks) {
  for (; blocks != 0; --blocks, pa += 64, pb += 64) {
    load_block(a, pa);
    load_block(b, pb);
    compress2(a, b);
  }
}

// state[] is {a,b,c,d},{e,f,g,h} with a in lane 0 <-> ABEF/CDGH (lanes 3..0).
KVCORE_INLINE void from_natural(const std::uint32_t state[8], __m128i& abef, __m128i& cdgh) {
  const __m128i abcd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
  const __m128i efgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
  const __m128i badc = _mm_shuffle_epi32(abcd, 0xB1);  // lanes 0..3: b a d c
  const __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);  // lanes 0..3: h g f e
  abef = _mm_alignr_epi8(badc, hgfe, 8);               // lanes 0..3: f e b a
  cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);            // lanes 0..3: h g d c
}

KVCORE_INLINE void compress_blocks(__m128i& abef, __m128i& cdgh, const std::uint8_t* p, std::size_t blocks) {
  for (; blocks != 0; --blocks, p += 64)
    compress(abef, cdgh, load_be(p), load_be(p + 16), load_be(p + 32), load_be(p + 48));
}

// ABEF/CDGH (lanes 0..3: f e b a / h g d c) to {a,b,c,d},{e,f,g,h}.
KVCORE_INLINE void to_natural(__m128i abef, __m128i cdgh, __m128i& abcd, __m128i& efgh) {
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);  // lanes 0..3: a b e f
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);  // lanes 0..3: g h c d
  abcd = _mm_blend_epi16(feba, dchg, 0xF0);
  efgh = _mm_alignr_epi8(dchg, feba, 8);
}

}  // namespace

void transform_shani(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks) {
  // state[] is {a,b,c,d},{e,f,g,h} with a in lane 0; convert once per call to
  // ABEF/CDGH (lanes 3..0) and keep it in registers across all blocks.
  const __m128i abcd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
  const __m128i efgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
  const __m128i badc = _mm_shuffle_epi32(abcd, 0xB1);  // lanes 0..3: b a d c
  const __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);  // lanes 0..3: h g f e
  __m128i abef = _mm_alignr_epi8(badc, hgfe, 8);       // lanes 0..3: f e b a
  __m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);    // lanes 0..3: h g d c

  compress_blocks(abef, cdgh, data, blocks);

  __m128i out0, out1;
  to_natural(abef, cdgh, out0, out1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), out0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), out1);
}

void chain_shani(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                 std::uint8_t* out) {
  detail::ChainPlan plan;
  detail::chain_plan_init(plan, len);
  const std::uint32_t* iv = detail::kInitialHash;
  const __m128i iv_abef =
      _mm_set_epi32(static_cast<int>(iv[0]), static_cast<int>(iv[1]), static_cast<int>(iv[4]), static_cast<int>(iv[5]));
  const __m128i iv_cdgh =
      _mm_set_epi32(static_cast<int>(iv[2]), static_cast<int>(iv[3]), static_cast<int>(iv[6]), static_cast<int>(iv[7]));

  // Message words 0..7 of each key are the previous key's digest words, i.e.
  // its final state in natural order: carried in registers from key to key.
  __m128i prev0 = load_be(parent);
  __m128i prev1 = load_be(parent + 16);
  for (std::size_t i = 0; i < n; ++i, data += len, out += 32) {
    detail::copy_short(plan.buf, data + plan.copy_off, plan.copy_len);
    const std::uint8_t* hi = plan.hi_from_buf ? plan.buf : data;

    __m128i abef = iv_abef;
    __m128i cdgh = iv_cdgh;
    compress(abef, cdgh, prev0, prev1, load_be(hi), load_be(hi + 16));
    if (plan.mid_blocks != 0) compress_blocks(abef, cdgh, data + 32, plan.mid_blocks);  // data + 32 may be past the end
    compress_blocks(abef, cdgh, plan.buf + plan.tail_off, plan.tail_blocks);

    to_natural(abef, cdgh, prev0, prev1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(prev0, bswap_mask()));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm_shuffle_epi8(prev1, bswap_mask()));
  }
}

void transform2_shani(std::uint32_t state_a[8], const std::uint8_t* data_a, std::uint32_t state_b[8],
                      const std::uint8_t* data_b, std::size_t blocks) {
  Lane a, b;
  from_natural(state_a, a.abef, a.cdgh);
  from_natural(state_b, b.abef, b.cdgh);
  compress_blocks2(a, data_a, b, data_b, blocks);
  __m128i out0, out1;
  to_natural(a.abef, a.cdgh, out0, out1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state_a), out0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state_a + 4), out1);
  to_natural(b.abef, b.cdgh, out0, out1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state_b), out0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state_b + 4), out1);
}

// chain_shani's loop with two chains in lock step. Both share len, so one plan
// shape serves both; each has its own tail buffer (different data bytes).
void chain2_shani(const std::uint8_t parent_a[32], const std::uint8_t* data_a, std::uint8_t* out_a,
                  const std::uint8_t parent_b[32], const std::uint8_t* data_b, std::uint8_t* out_b, std::size_t len,
                  std::size_t n) {
  detail::ChainPlan plan_a, plan_b;
  detail::chain_plan_init(plan_a, len);
  detail::chain_plan_init(plan_b, len);
  const std::uint32_t* iv = detail::kInitialHash;
  const __m128i iv_abef =
      _mm_set_epi32(static_cast<int>(iv[0]), static_cast<int>(iv[1]), static_cast<int>(iv[4]), static_cast<int>(iv[5]));
  const __m128i iv_cdgh =
      _mm_set_epi32(static_cast<int>(iv[2]), static_cast<int>(iv[3]), static_cast<int>(iv[6]), static_cast<int>(iv[7]));

  // Each chain's previous digest, in natural word order: message words 0..7 of its next key.
  __m128i prev_a0 = load_be(parent_a), prev_a1 = load_be(parent_a + 16);
  __m128i prev_b0 = load_be(parent_b), prev_b1 = load_be(parent_b + 16);
  const std::size_t mid = plan_a.mid_blocks, tail = plan_a.tail_blocks;
  for (std::size_t i = 0; i < n; ++i, data_a += len, data_b += len, out_a += 32, out_b += 32) {
    detail::copy_short(plan_a.buf, data_a + plan_a.copy_off, plan_a.copy_len);
    detail::copy_short(plan_b.buf, data_b + plan_b.copy_off, plan_b.copy_len);
    const std::uint8_t* hi_a = plan_a.hi_from_buf ? plan_a.buf : data_a;
    const std::uint8_t* hi_b = plan_b.hi_from_buf ? plan_b.buf : data_b;

    Lane a{iv_abef, iv_cdgh, prev_a0, prev_a1, load_be(hi_a), load_be(hi_a + 16)};
    Lane b{iv_abef, iv_cdgh, prev_b0, prev_b1, load_be(hi_b), load_be(hi_b + 16)};
    compress2(a, b);
    if (mid != 0) compress_blocks2(a, data_a + 32, b, data_b + 32, mid);  // data + 32 may be past the end
    compress_blocks2(a, plan_a.buf + plan_a.tail_off, b, plan_b.buf + plan_b.tail_off, tail);

    to_natural(a.abef, a.cdgh, prev_a0, prev_a1);
    to_natural(b.abef, b.cdgh, prev_b0, prev_b1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out_a), _mm_shuffle_epi8(prev_a0, bswap_mask()));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out_a + 16), _mm_shuffle_epi8(prev_a1, bswap_mask()));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out_b), _mm_shuffle_epi8(prev_b0, bswap_mask()));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out_b + 16), _mm_shuffle_epi8(prev_b1, bswap_mask()));
  }
}

#undef KVCORE_INLINE

}  // namespace sha256
}  // namespace kvcore

#endif  // x86
