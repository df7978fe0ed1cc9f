#include "kvcore/checksum.h"

#include <array>
#include <cstring>

#include "crc_table.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace kvcore {

namespace {

// The raw register update (no inversions).
std::uint32_t update_portable(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
  static const crc_table::Table table = crc_table::make(0x82F63B78u);  // Castagnoli, reflected
  return crc_table::update(table, crc, p, n);
}

std::uint64_t load64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::uint64_t fold(const std::array<std::uint32_t, 4>& c) {
  std::uint64_t out = 0;
  for (int k = 0; k < 4; ++k) {
    const std::uint64_t lane = ~c[k];  // each lane's finished CRC, rotated into its own place
    out ^= (lane << (16 * k)) | (lane >> (64 - 16 * k) % 64);
  }
  return out;
}

#if defined(__x86_64__)
#define KVCORE_CRC_TARGET __attribute__((target("sse4.2")))
KVCORE_CRC_TARGET std::uint32_t step8(std::uint32_t crc, std::uint64_t v) {
  return static_cast<std::uint32_t>(_mm_crc32_u64(crc, v));
}
KVCORE_CRC_TARGET std::uint32_t step1(std::uint32_t crc, std::uint8_t v) { return _mm_crc32_u8(crc, v); }
bool detect() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 20)) != 0;  // SSE4.2
}
#elif defined(__aarch64__)
#define KVCORE_CRC_TARGET __attribute__((target("+crc")))
KVCORE_CRC_TARGET std::uint32_t step8(std::uint32_t crc, std::uint64_t v) { return __crc32cd(crc, v); }
KVCORE_CRC_TARGET std::uint32_t step1(std::uint32_t crc, std::uint8_t v) { return __crc32cb(crc, v); }
bool detect() { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#else
bool detect() { return false; }
#endif

#if defined(KVCORE_CRC_TARGET)
KVCORE_CRC_TARGET std::uint32_t update_hardware(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
  for (; n >= 8; n -= 8, p += 8) crc = step8(crc, load64(p));
  for (; n; --n) crc = step1(crc, *p++);
  return crc;
}

// Four lanes of `lane` bytes (a multiple of 8) from p, p + lane, ...: one CRC register each.
KVCORE_CRC_TARGET void lanes_hardware(const std::uint8_t* p, std::uint64_t lane, std::array<std::uint32_t, 4>& c) {
  for (std::uint64_t i = 0; i < lane; i += 8) {
    c[0] = step8(c[0], load64(p + i));
    c[1] = step8(c[1], load64(p + lane + i));
    c[2] = step8(c[2], load64(p + 2 * lane + i));
    c[3] = step8(c[3], load64(p + 3 * lane + i));
  }
}
#endif

const bool kHardware = detect();

}  // namespace

bool crc32c_hardware() { return kHardware; }

std::uint32_t crc32c(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
#if defined(KVCORE_CRC_TARGET)
  if (kHardware) return ~update_hardware(~crc, p, n);
#endif
  return ~update_portable(~crc, p, n);
}

std::uint64_t page_checksum_portable(const std::uint8_t* p, std::uint64_t n) {
  if (n % 32 != 0) return ~update_portable(~0u, p, n);
  const std::uint64_t lane = n / 4;
  std::array<std::uint32_t, 4> c{};
  for (int k = 0; k < 4; ++k) c[k] = update_portable(~0u, p + k * lane, lane);
  return fold(c);
}

std::uint64_t page_checksum(const std::uint8_t* p, std::uint64_t n) {
#if defined(KVCORE_CRC_TARGET)
  if (kHardware) {
    if (n % 32 != 0) return ~update_hardware(~0u, p, n);
    std::array<std::uint32_t, 4> c{~0u, ~0u, ~0u, ~0u};
    lanes_hardware(p, n / 4, c);
    return fold(c);
  }
#endif
  return page_checksum_portable(p, n);
}

}  // namespace kvcore
