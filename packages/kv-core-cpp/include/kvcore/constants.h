// The contract's constants (kv_api.constants); _core exports them so the conformance suite can
// check that the core uses the same values.
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

}  // namespace kvcore
