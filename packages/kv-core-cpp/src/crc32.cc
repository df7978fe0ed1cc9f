// CRC-32, zlib's (crc32.h). The x86-64 path folds the message 64 bytes at a time into four
// 128-bit lanes by carry-less multiplication (each lane times x^k mod P moves it k bits on), then
// into one lane, whose 16 bytes the table finishes: the CRC of a message is that of what it
// folds to. The fold constants are computed here from the polynomial.
#include "kvcore/crc32.h"

#include <cstring>

#include "crc_table.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace kvcore {

namespace {

// The raw register update (no inversions).
std::uint32_t update_portable(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
  static const crc_table::Table table = crc_table::make(0xEDB88320u);  // zlib's, reflected
  return crc_table::update(table, crc, p, n);
}

#if defined(__x86_64__)
#define KVCORE_CRC32_TARGET __attribute__((target("pclmul,sse4.1")))

// x^k mod P (P = 0x104C11DB7, bit i the coefficient of x^i), bit-reflected and shifted left
// once: the factor that moves a reflected 64-bit half k - 32 bits on (one bit of the shift is
// the carry-less product's, reflected).
constexpr std::uint64_t fold_constant(int k) {
  std::uint64_t r = 1;
  for (int i = 0; i < k; ++i) {
    r <<= 1;
    if (r & (1ull << 32)) r ^= 0x104C11DB7ull;
  }
  std::uint64_t reflected = 0;
  for (int i = 0; i < 32; ++i) reflected |= ((r >> i) & 1u) << (31 - i);
  return reflected << 1;
}

// Per fold distance (bits): the factors of a lane's low half (earlier in the message) and high half.
constexpr std::uint64_t kBy4Low = fold_constant(512 + 32), kBy4High = fold_constant(512 - 32);
constexpr std::uint64_t kBy1Low = fold_constant(128 + 32), kBy1High = fold_constant(128 - 32);

KVCORE_CRC32_TARGET inline __m128i fold(__m128i lane, __m128i factors) {
  return _mm_xor_si128(_mm_clmulepi64_si128(lane, factors, 0x00), _mm_clmulepi64_si128(lane, factors, 0x11));
}

KVCORE_CRC32_TARGET inline __m128i load(const std::uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The raw update of n >= 64 bytes.
KVCORE_CRC32_TARGET std::uint32_t update_hardware(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
  if (n < 64) return update_portable(crc, p, n);
  // The register goes into the first four bytes: the CRC of the rest from zero is then the same.
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  p += 64;
  n -= 64;
  const __m128i by4 = _mm_set_epi64x(static_cast<long long>(kBy4High), static_cast<long long>(kBy4Low));
  for (; n >= 64; n -= 64, p += 64) {
    x0 = _mm_xor_si128(fold(x0, by4), load(p));
    x1 = _mm_xor_si128(fold(x1, by4), load(p + 16));
    x2 = _mm_xor_si128(fold(x2, by4), load(p + 32));
    x3 = _mm_xor_si128(fold(x3, by4), load(p + 48));
  }
  const __m128i by1 = _mm_set_epi64x(static_cast<long long>(kBy1High), static_cast<long long>(kBy1Low));
  __m128i x = _mm_xor_si128(fold(x0, by1), x1);
  x = _mm_xor_si128(fold(x, by1), x2);
  x = _mm_xor_si128(fold(x, by1), x3);
  for (; n >= 16; n -= 16, p += 16) x = _mm_xor_si128(fold(x, by1), load(p));
  std::uint8_t last[16];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(last), x);
  return update_portable(update_portable(0, last, 16), p, n);
}

bool detect() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // PCLMULQDQ (bit 1) and SSE4.1 (bit 19)
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 1)) != 0 && (ecx & (1u << 19)) != 0;
}
#elif defined(__aarch64__)
#define KVCORE_CRC32_TARGET __attribute__((target("+crc")))

KVCORE_CRC32_TARGET std::uint32_t update_hardware(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t v;
    std::memcpy(&v, p, sizeof v);  // little-endian host
    crc = __crc32d(crc, v);
  }
  for (; n; --n) crc = __crc32b(crc, *p++);
  return crc;
}

bool detect() { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#else
bool detect() { return false; }
#endif

const bool kHardware = detect();

}  // namespace

bool crc32_hardware() { return kHardware; }

std::uint32_t crc32_portable(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
  return ~update_portable(~crc, p, n);
}

std::uint32_t crc32(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
#if defined(KVCORE_CRC32_TARGET)
  if (kHardware) return ~update_hardware(~crc, p, n);
#endif
  return crc32_portable(crc, p, n);
}

}  // namespace kvcore
