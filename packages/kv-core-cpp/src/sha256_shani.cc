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

// The SHA-NI operations sha256_rounds.h builds the kernels from.
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

  KVCORE_INLINE static void store_be(std::uint8_t* p, __m128i v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_shuffle_epi8(v, bswap_mask()));
  }

  KVCORE_INLINE static __m128i add(__m128i a, __m128i b) { return _mm_add_epi32(a, b); }

  KVCORE_INLINE static void initial(__m128i& abef, __m128i& cdgh) {
    const std::uint32_t* iv = detail::kInitialHash;
    abef = _mm_set_epi32(static_cast<int>(iv[0]), static_cast<int>(iv[1]), static_cast<int>(iv[4]),
                         static_cast<int>(iv[5]));
    cdgh = _mm_set_epi32(static_cast<int>(iv[2]), static_cast<int>(iv[3]), static_cast<int>(iv[6]),
                         static_cast<int>(iv[7]));
  }

  // state[] is {a,b,c,d},{e,f,g,h} with a in lane 0 <-> ABEF/CDGH (lanes 3..0).
  KVCORE_INLINE static void load_state(const std::uint32_t state[8], __m128i& abef, __m128i& cdgh) {
    const __m128i abcd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));
    const __m128i efgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));
    const __m128i badc = _mm_shuffle_epi32(abcd, 0xB1);  // lanes 0..3: b a d c
    const __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1B);  // lanes 0..3: h g f e
    abef = _mm_alignr_epi8(badc, hgfe, 8);               // lanes 0..3: f e b a
    cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);            // lanes 0..3: h g d c
  }

  // ABEF/CDGH (lanes 0..3: f e b a / h g d c) to {a,b,c,d},{e,f,g,h}: the digest's words.
  KVCORE_INLINE static void digest_words(__m128i abef, __m128i cdgh, __m128i& abcd, __m128i& efgh) {
    const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);  // lanes 0..3: a b e f
    const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);  // lanes 0..3: g h c d
    abcd = _mm_blend_epi16(feba, dchg, 0xF0);
    efgh = _mm_alignr_epi8(dchg, feba, 8);
  }

  KVCORE_INLINE static void store_state(std::uint32_t state[8], __m128i abef, __m128i cdgh) {
    __m128i abcd, efgh;
    digest_words(abef, cdgh, abcd, efgh);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state), abcd);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), efgh);
  }
};

using R = Rounds<ShaNi>;

#undef KVCORE_INLINE

}  // namespace

KVCORE_SHA256_KERNELS(shani, R)

}  // namespace sha256
}  // namespace kvcore

#endif  // x86
