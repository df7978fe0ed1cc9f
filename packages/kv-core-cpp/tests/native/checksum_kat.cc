// Known-answer and cross-check tests of the disk pages' checksum (kvcore/checksum.h): CRC-32C
// test vectors, and page_checksum (CRC instructions where the CPU has them) against the table
// version on pages of many sizes; and of the store values' CRC-32 (kvcore/crc32.h), zlib's test
// vector and the instructions' path against the table at every length to 300 and some larger,
// from unaligned starts and continuing a CRC. With KVCORE_CHECKSUM_HARDWARE=1, also asserts that
// the CPU's instructions are the ones in use, so CI proves which code path ran.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvcore/checksum.h"
#include "kvcore/crc32.h"

namespace {

int g_failed = 0;
int g_passed = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "PASS" : "FAIL", what.c_str());
  (ok ? g_passed : g_failed)++;
}

std::uint32_t crc_of(const std::vector<std::uint8_t>& bytes) { return kvcore::crc32c(0, bytes.data(), bytes.size()); }

std::vector<std::uint8_t> noise(std::size_t n, std::uint64_t& state) {
  std::vector<std::uint8_t> out(n);
  for (auto& b : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<std::uint8_t>(state >> 56);
  }
  return out;
}

void crc32_tests() {
  const auto* digits = reinterpret_cast<const std::uint8_t*>("123456789");
  check(kvcore::crc32(0, digits, 9) == 0xCBF43926u, "crc32(\"123456789\")");
  check(kvcore::crc32_portable(0, digits, 9) == 0xCBF43926u, "crc32_portable(\"123456789\")");
  std::uint64_t state = 0x243F6A8885A308D3ull;
  const std::vector<std::uint8_t> bytes = noise(262144 + 64, state);
  int mismatched = 0;
  for (std::size_t n = 0; n <= 300; ++n) {
    for (std::size_t start : {0, 1, 7}) {  // unaligned loads too
      const std::uint32_t seed = static_cast<std::uint32_t>(n * 2654435761u);
      if (kvcore::crc32(seed, bytes.data() + start, n) != kvcore::crc32_portable(seed, bytes.data() + start, n))
        ++mismatched;
    }
  }
  check(mismatched == 0, "crc32 = table, every length 0-300 from three starts");
  for (std::size_t n : {2048, 2048 + 120 + 8, 65536 + 13, 262144}) {
    const std::uint32_t whole = kvcore::crc32(0, bytes.data() + 3, n);
    check(whole == kvcore::crc32_portable(0, bytes.data() + 3, n), "crc32 = table, " + std::to_string(n));
    const std::size_t cut = n / 3;
    check(kvcore::crc32(kvcore::crc32(0, bytes.data() + 3, cut), bytes.data() + 3 + cut, n - cut) == whole,
          "crc32 continued, " + std::to_string(n));
    std::vector<std::uint8_t> flipped(bytes.begin() + 3, bytes.begin() + 3 + static_cast<std::ptrdiff_t>(n));
    flipped[n - 1] ^= 0x80;  // the last bit, past every fold
    check(kvcore::crc32(0, flipped.data(), n) != whole, "crc32, one flipped bit, " + std::to_string(n));
  }
}

}  // namespace

int main() {
  const char* digits = "123456789";
  check(kvcore::crc32c(0, reinterpret_cast<const std::uint8_t*>(digits), 9) == 0xE3069283u, "crc32c(\"123456789\")");
  check(crc_of(std::vector<std::uint8_t>(32, 0x00)) == 0x8A9136AAu, "crc32c(32 x 0x00)");
  check(crc_of(std::vector<std::uint8_t>(32, 0xFF)) == 0x62A8AB43u, "crc32c(32 x 0xFF)");
  std::vector<std::uint8_t> ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<std::uint8_t>(i);
  check(crc_of(ascending) == 0x46DD794Eu, "crc32c(0..31)");
  // Continuing a CRC over two pieces is the CRC of the whole.
  check(kvcore::crc32c(kvcore::crc32c(0, ascending.data(), 13), ascending.data() + 13, 19) == 0x46DD794Eu,
        "crc32c continued");

  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  for (std::uint64_t size : {32ull, 64ull, 96ull, 100ull, 4096ull, 4101ull, 262144ull}) {
    std::vector<std::uint8_t> page(size);
    for (auto& b : page) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<std::uint8_t>(state >> 56);
    }
    const std::uint64_t sum = kvcore::page_checksum(page.data(), size);
    check(sum == kvcore::page_checksum_portable(page.data(), size), "page_checksum = table, " + std::to_string(size));
    page[size / 2] ^= 1;  // one bit anywhere changes it
    check(kvcore::page_checksum(page.data(), size) != sum, "one flipped bit, " + std::to_string(size));
  }
  crc32_tests();
  std::printf("CRC instructions: %s; CRC-32 by the CPU's instructions: %s\n", kvcore::crc32c_hardware() ? "yes" : "no",
              kvcore::crc32_hardware() ? "yes" : "no");
  const char* want = std::getenv("KVCORE_CHECKSUM_HARDWARE");
  if (want != nullptr && std::strcmp(want, "1") == 0) {
    check(kvcore::crc32c_hardware(), "the CRC instructions are in use");
    check(kvcore::crc32_hardware(), "the CRC-32 instructions are in use");
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
