// The contract's constants (kv_api.constants); _core exports them so the conformance suite can
// check that the core uses the same values. Compile-time values only: no state, any thread.
#pragma once

#include <cstdint>

namespace kvcore {

// Page index of a block without a locked page (stale, evicted or not allocated).
constexpr std::int32_t kBadPageIndex = -1;
// Cache level of the device tier.
constexpr int kGpuLevel = 0;
// Eviction priorities a priority callback may give; pages get kDefaultPriority without one.
constexpr int kMinPriority = 0;
constexpr int kDefaultPriority = 35;
constexpr int kMaxPriority = 100;
// Exclusive upper bounds of the contract's ints the binding checks (kv_api.constants, where the
// config's bounds are checked too): token counts, ids given to create_kv_cache, and
// max_kv_event_entries in [-kEventEntriesLimit, kEventEntriesLimit).
constexpr std::int64_t kTokenLimit = std::int64_t{1} << 40;
constexpr std::int64_t kCacheIdLimit = std::int64_t{1} << 62;
constexpr std::int64_t kEventEntriesLimit = std::int64_t{1} << 31;

// A block-key format (docs/key-format.md): how an int token is encoded and its range.
enum class KeyFormat : std::uint8_t { kU32, kU64 };
// Format names, indexed by KeyFormat.
constexpr const char* kKeyFormatNames[] = {"sha256-u32", "sha256-u64"};
constexpr KeyFormat kDefaultKeyFormat = KeyFormat::kU32;

// ceil(a / b) for a >= 0, b > 0: the rounding of every block count the contract defines. Never
// a + b - 1, which wraps for a b near the type's maximum (a tokens_per_block of 2**64 or more
// arrives as the largest u64).
template <typename T>
constexpr T ceil_div(T a, T b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace kvcore
