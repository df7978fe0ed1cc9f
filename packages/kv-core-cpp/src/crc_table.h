// A reflected CRC-32's byte-at-a-time table and the raw register update through it (no
// inversions): the portable path of both checksums, checksum.cc's CRC-32C and crc32.cc's CRC-32.
#pragma once

#include <array>
#include <cstdint>

namespace kvcore::crc_table {

using Table = std::array<std::uint32_t, 256>;

inline Table make(std::uint32_t reflected_polynomial) {
  Table table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? reflected_polynomial : 0u);
    table[i] = c;
  }
  return table;
}

inline std::uint32_t update(const Table& table, std::uint32_t crc, const std::uint8_t* p, std::uint64_t n) {
  while (n--) crc = table[(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
  return crc;
}

}  // namespace kvcore::crc_table
