// The checksum of a page written to disk (the twin of disk_pool.py's checksum): CRC-32C
// (Castagnoli), by the SSE4.2 or ARMv8 CRC instructions where the CPU has them, else a table.
// Pure functions (the instructions are chosen once, when the library loads): any thread, no lock.
#pragma once

#include <cstdint>

namespace kvcore {

// CRC-32C of n bytes, continuing `crc` (start from 0; the usual pre- and post-inversion done here).
std::uint32_t crc32c(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n);
// A page's checksum: four CRC-32Cs of its quarters, interleaved so the instruction's latency
// overlaps, folded into 64 bits (a page whose size is not a multiple of 32 bytes: one CRC).
std::uint64_t page_checksum(const std::uint8_t* p, std::uint64_t n);
// The same with the table only (the known-answer test compares the two).
std::uint64_t page_checksum_portable(const std::uint8_t* p, std::uint64_t n);
// Whether page_checksum uses the CPU's CRC instructions.
bool crc32c_hardware();

}  // namespace kvcore
