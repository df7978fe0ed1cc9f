// x86 SHA-NI SHA-256 block transform. Built with -msha -msse4.1 for this TU
// only; sha256.cc calls it only after CPUID reports SHA and SSE4.1.

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "sha256_rounds.h"
#include "sha256_transforms.h"

namespace kvcore {
namespace sha256 {
namespace {

#define KVCORE_INLINE inline __attribute__((always_inline))

// Byte-swaps each 32-bit lane: message words and digests are big-endian.
KVCORE_INLINE __m128i bswap_mask() { return _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL); }

// The SHA-NI operations sha256_rounds.h builds the compression from.
struct ShaNi {
  using Vec = __m128i;

  // SHA256RNDS2 works on the state split as ABEF / CDGH (A in the top lane). Each call does
  // two rounds using the low two dwords of `wk` (W+K), so four rounds are two calls with the
  // high half shuffled down in between. After the pair, the register roles are back where they
  // started: the first call's result is the new ABEF, and the old ABEF becomes the new CDGH.
  KVCORE_INLINE static void four_rounds(__m128i& abef, __m128i& cdgh, __m128i w, int t) {
    __m128i wk = _mm_add_epi32(w, _mm_load_si128(reinterpret_cast<const __m128i*>(detail::kRoundConstants + t)));
    cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
    wk = _mm_shuffle_epi32(wk, 0x0E);
    abef = _mm_sha256rnds2_epu32(abef, cdgh, wk);
  }

  // W[t..t+3] from the previous 16 words (w0 oldest). MSG1 adds sigma0 of W[t-15..t-12] to
  // W[t-16..t-13]; we add W[t-7..t-4] (an alignr of w2:w3); MSG2 then adds sigma1 terms,
  // including the ones depending on its own output.
  KVCORE_INLINE static __m128i schedule(__m128i w0, __m128i w1, __m128i w2, __m128i w3) {
    __m128i x = _mm_sha256msg1_epu32(w0, w1);
    x = _mm_add_epi32(x, _mm_alignr_epi8(w3, w2, 4));
    return _mm_sha256msg2_epu32(x, w3);
  }

  KVCORE_INLINE static __m128i load_be(const std::uint8_t* p) {
    return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), bswap_mask());
  }

  KVCORE_INLINE static __m128i add(__m128i a, __m128i b) { return _mm_add_epi32(a, b); }
};

using R = Rounds<ShaNi>;

KVCORE_INLINE __m128i load_be(const std::uint8_t* p) { return ShaNi::load_be(p); }

// state[] is {a,b,c,d},{e,f,g,h} with a in lane 0 <-> ABEF/CDGH (lanes 3..0).
KVCORE_INLINE void from_natural(const std::uint32_t state[8], __m128i& abef, __m128i& cdgh) {
  const __m128i abcd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
  const __m128i efgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
  const __m128i badc = _mm_shuffle_epi32(abcd, 0xB1);  // lanes 0..3: b a d c
  const __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);  // lanes 0..3: h g f e
  abef = _mm_alignr_epi8(badc, hgfe, 8);               // lanes 0..3: f e b a
  cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);            // lanes 0..3: h g d c
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

  R::compress_blocks(abef, cdgh, data, blocks);

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
    R::compress(abef, cdgh, prev0, prev1, load_be(hi), load_be(hi + 16));
    if (plan.mid_blocks != 0)
      R::compress_blocks(abef, cdgh, data + 32, plan.mid_blocks);  // data + 32 may be past the end
    R::compress_blocks(abef, cdgh, plan.buf + plan.tail_off, plan.tail_blocks);

    to_natural(abef, cdgh, prev0, prev1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_shuffle_epi8(prev0, bswap_mask()));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm_shuffle_epi8(prev1, bswap_mask()));
  }
}

void transform2_shani(std::uint32_t state_a[8], const std::uint8_t* data_a, std::uint32_t state_b[8],
                      const std::uint8_t* data_b, std::size_t blocks) {
  R::Lane a, b;
  from_natural(state_a, a.s0, a.s1);
  from_natural(state_b, b.s0, b.s1);
  R::compress_blocks2(a, data_a, b, data_b, blocks);
  __m128i out0, out1;
  to_natural(a.s0, a.s1, out0, out1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state_a), out0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state_a + 4), out1);
  to_natural(b.s0, b.s1, out0, out1);
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

    R::Lane a{iv_abef, iv_cdgh, prev_a0, prev_a1, load_be(hi_a), load_be(hi_a + 16)};
    R::Lane b{iv_abef, iv_cdgh, prev_b0, prev_b1, load_be(hi_b), load_be(hi_b + 16)};
    R::compress2(a, b);
    if (mid != 0) R::compress_blocks2(a, data_a + 32, b, data_b + 32, mid);  // data + 32 may be past the end
    R::compress_blocks2(a, plan_a.buf + plan_a.tail_off, b, plan_b.buf + plan_b.tail_off, tail);

    to_natural(a.s0, a.s1, prev_a0, prev_a1);
    to_natural(b.s0, b.s1, prev_b0, prev_b1);
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
