// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320, pre- and post-inverted; the twin
// of Python's zlib.crc32): the checksum of a value sent to a remote tier's store, which both
// backends write and check (kv_api.block_value). Carry-less multiplication (x86-64 PCLMULQDQ)
// or the ARMv8 CRC instructions where the CPU has them, else a table. Pure functions (the path
// is chosen once, when the library loads): any thread, no lock.
#pragma once

#include <cstdint>

namespace kvcore {

// CRC-32 of n bytes, continuing `crc` (start from 0), as zlib.crc32(data, crc).
std::uint32_t crc32(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n);
// The same with the table only (the known-answer test compares the two).
std::uint32_t crc32_portable(std::uint32_t crc, const std::uint8_t* p, std::uint64_t n);
// Whether crc32 uses the CPU's instructions (carry-less multiply or CRC).
bool crc32_hardware();

}  // namespace kvcore
