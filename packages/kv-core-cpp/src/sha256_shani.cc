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

}  // namespace

void transform_shani(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks) {
  // Byte-swaps each 32-bit lane: message words are big-endian.
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);

  // state[] is {a,b,c,d},{e,f,g,h} with a in lane 0; convert once per call to
  // ABEF/CDGH (lanes 3..0) and keep it in registers across all blocks.
  const __m128i abcd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
  const __m128i efgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
  const __m128i badc = _mm_shuffle_epi32(abcd, 0xB1);  // lanes 0..3: b a d c
  const __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);  // lanes 0..3: h g f e
  __m128i abef = _mm_alignr_epi8(badc, hgfe, 8);       // lanes 0..3: f e b a
  __m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);    // lanes 0..3: h g d c

  for (; blocks != 0; --blocks, data += 64) {
    const __m128i abef_in = abef;
    const __m128i cdgh_in = cdgh;
    const __m128i* p = reinterpret_cast<const __m128i*>(data);
    __m128i w0 = _mm_shuffle_epi8(_mm_loadu_si128(p + 0), bswap);
    __m128i w1 = _mm_shuffle_epi8(_mm_loadu_si128(p + 1), bswap);
    __m128i w2 = _mm_shuffle_epi8(_mm_loadu_si128(p + 2), bswap);
    __m128i w3 = _mm_shuffle_epi8(_mm_loadu_si128(p + 3), bswap);

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

  // Back to {a,b,c,d},{e,f,g,h}.
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);  // lanes 0..3: a b e f
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);  // lanes 0..3: g h c d
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), _mm_alignr_epi8(dchg, feba, 8));
}

#undef KVCORE_INLINE

}  // namespace sha256
}  // namespace kvcore

#endif  // x86
