#include "kvcore/slot_counts.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "kvcore/constants.h"
#include "kvcore/error.h"

namespace kvcore {

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kGiB = 1ull << 30;

int bit_length(std::uint64_t v) {
  int n = 0;
  while (v) {
    ++n;
    v >>= 1;
  }
  return n;
}

// Quotas are below 2**63 (kv_api.config.QUOTA_LIMIT); a minimum beyond is slot_counts.py's
// min_quota_error, raised before anything is allocated.
constexpr std::uint64_t kQuotaLimit = std::uint64_t{1} << 63;
constexpr double kQuotaLimitDouble = 9223372036854775808.0;  // 2**63, exact

[[noreturn]] void throw_min_quota_error(const char* tier = "device") {
  throw Error(ErrorKind::kHostOOM, std::string(tier) + " tier: the minimum slots need 2**63 bytes or more");
}

// The number of ints in the union of the half-open ranges (each non-empty).
std::int64_t union_length(std::vector<std::pair<std::int64_t, std::int64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::int64_t count = 0, reach = 0;
  for (const auto& [lo, hi] : ranges) {
    const std::int64_t from = std::max(lo, reach);  // the part below reach is counted already
    if (hi > from) {
      count += hi - from;
      reach = hi;
    }
  }
  return count;
}

// Python's round(): to nearest, ties to even (the default rounding mode of nearbyint).
double round_half_even(double v) { return std::nearbyint(v); }

std::vector<std::uint64_t> compute_min_slots(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry,
                                             const StorageConfig& storage) {
  std::vector<std::uint64_t> per_layer_group;
  const auto rules = scratch_rules(config, registry, storage);
  for (int layer_group = 0; layer_group < static_cast<int>(registry.size()); ++layer_group) {
    std::int64_t floor = registry.min_slots_floor(layer_group);
    const ScratchRule* rule = rules[layer_group] ? &*rules[layer_group] : nullptr;
    for (const BatchDesc& batch : config.constraints) {
      // The same float division as slot_counts.py; checked before the cast, which would be
      // undefined for inf or anything beyond int64.
      const double need =
          static_cast<double>(slots_for_batch(registry, layer_group, batch, rule)) / config.max_util_for_resume;
      if (!(need < kQuotaLimitDouble)) throw_min_quota_error();
      floor = std::max(floor, static_cast<std::int64_t>(std::ceil(need)));
    }
    per_layer_group.push_back(static_cast<std::uint64_t>(floor));
  }
  std::vector<std::uint64_t> out;
  for (const PoolGroupConfig& pg : storage.pool_groups()) {
    std::uint64_t sum = 0;
    // Each term is below 2**63, so a sum of two never wraps; at 2**63 slots the bytes are too.
    for (int group : pg.life_cycles) {
      sum += per_layer_group[group];
      if (sum >= kQuotaLimit) throw_min_quota_error();
    }
    out.push_back(sum);
  }
  return out;
}

// slot_counts.py's min_quota: the bytes the minimum slots occupy, each pool rounded up to grains.
// Every step is checked against 2**63, so nothing wraps: each term only grows the total, so the
// first step to reach 2**63 means the exact total does too (where the Python backend raises).
std::uint64_t min_quota(const std::vector<std::uint64_t>& minimum, const std::vector<PoolGroupConfig>& groups,
                        std::uint64_t g, const char* tier) {
  std::uint64_t total = 0;
  for (const PoolGroupConfig& pg : groups) {
    for (std::uint64_t size : pg.slot_sizes) {
      std::uint64_t bytes = 0;
      if (__builtin_mul_overflow(minimum[pg.index], size, &bytes) || bytes >= kQuotaLimit) throw_min_quota_error(tier);
      total += ceil_div(bytes, g) * g;  // < 2**63 + g and total < 2**63 before: no wrap
      if (total >= kQuotaLimit) throw_min_quota_error(tier);
    }
  }
  return total;
}

// Per pool group, the sum of its layer groups' entries (one per layer group), added in
// layer-group order as slot_counts.py does.
std::vector<double> pool_group_ratio(const std::vector<double>& ratio, const std::vector<PoolGroupConfig>& groups) {
  std::size_t layer_groups = 0;
  for (const PoolGroupConfig& pg : groups) layer_groups += pg.life_cycles.size();
  if (ratio.size() != layer_groups) {
    const std::string rule = "initial_pool_ratio length must match number of layer groups";
    throw Error(ErrorKind::kValue, "KVCacheManagerConfig.initial_pool_ratio: " + rule + " (expected " +
                                       std::to_string(layer_groups) + ", got " + std::to_string(ratio.size()) + ")");
  }
  std::vector<double> out;
  for (const PoolGroupConfig& pg : groups) {
    double share = 0.0;
    for (int group : pg.life_cycles) share += ratio[group];
    out.push_back(share);
  }
  return out;
}

std::vector<double> initial_ratio(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry,
                                  const StorageConfig& storage, const std::vector<std::uint64_t>& minimum) {
  const auto& groups = storage.pool_groups();
  if (config.initial_pool_ratio) return pool_group_ratio(*config.initial_pool_ratio, groups);
  std::vector<std::uint64_t> slots;
  if (!config.typical_step && !config.constraints.empty()) {
    for (const PoolGroupConfig& pg : groups) slots.push_back(minimum[pg.index]);
  } else {
    const BatchDesc batch = config.typical_step ? *config.typical_step : BatchDesc{{{2049, 2048}}, 0};
    const auto rules = scratch_rules(config, registry, storage);
    for (const PoolGroupConfig& pg : groups) {
      std::uint64_t n = 0;
      for (int group : pg.life_cycles) {
        n += static_cast<std::uint64_t>(
            slots_for_batch(registry, group, batch, rules[group] ? &*rules[group] : nullptr));
      }
      slots.push_back(n);
    }
  }
  return bytes_ratio(slots, groups);
}

}  // namespace

std::vector<double> bytes_ratio(const std::vector<std::uint64_t>& slots, const std::vector<PoolGroupConfig>& groups) {
  // Bytes as doubles, multiplied and added in order, as Python does: exact products could
  // exceed 64 bits.
  std::vector<double> weights;
  double total = 0.0;
  for (std::size_t p = 0; p < groups.size(); ++p) {
    weights.push_back(static_cast<double>(slots[p]) * static_cast<double>(groups[p].slot_bytes()));
    total += weights.back();
  }
  std::vector<double> ratio;
  for (double w : weights) ratio.push_back(total != 0.0 ? w / total : 1.0 / groups.size());
  return ratio;
}

namespace {

std::vector<std::uint64_t> distribute(const std::vector<double>& ratio, const std::vector<std::uint64_t>& minimum,
                                      const std::vector<PoolGroupConfig>& groups, std::uint64_t grains,
                                      std::uint64_t g) {
  const std::size_t n = groups.size();
  std::vector<bool> pinned(n, false);
  std::vector<std::uint64_t> slots(n, 0);
  while (true) {
    std::int64_t budget = static_cast<std::int64_t>(grains);
    for (std::size_t p = 0; p < n; ++p) {
      if (pinned[p]) budget -= static_cast<std::int64_t>(grains_for(minimum[p], groups[p].slot_sizes, g));
    }
    std::vector<std::size_t> free;
    for (std::size_t p = 0; p < n; ++p) {
      if (!pinned[p]) free.push_back(p);
    }
    std::stable_sort(free.begin(), free.end(), [&](std::size_t a, std::size_t b) {
      return ratio[a] < ratio[b] || (ratio[a] == ratio[b] && a < b);
    });
    double remaining = 0.0;
    for (std::size_t p : free) remaining += ratio[p];
    for (std::size_t p : free) {
      std::int64_t share =
          remaining > 0 ? static_cast<std::int64_t>(round_half_even(static_cast<double>(budget) * ratio[p] / remaining))
                        : 0;
      share = std::max<std::int64_t>(0, std::min(share, budget));
      budget -= share;
      remaining -= ratio[p];
      slots[p] = max_slots(static_cast<std::uint64_t>(share), groups[p].slot_sizes, g);
    }
    bool any_new = false;
    for (std::size_t p : free) {
      if (slots[p] <= minimum[p]) {
        pinned[p] = true;
        any_new = true;
      }
    }
    for (std::size_t p = 0; p < n; ++p) {
      if (pinned[p]) slots[p] = minimum[p];
    }
    if (!any_new || std::all_of(pinned.begin(), pinned.end(), [](bool b) { return b; })) break;
  }
  std::int64_t leftover = static_cast<std::int64_t>(grains);
  for (std::size_t p = 0; p < n; ++p)
    leftover -= static_cast<std::int64_t>(grains_for(slots[p], groups[p].slot_sizes, g));
  for (std::size_t p = 0; p < n; ++p) {
    const std::uint64_t used = grains_for(slots[p], groups[p].slot_sizes, g);
    const std::int64_t room = static_cast<std::int64_t>(used) + leftover;
    if (room > 0) slots[p] = std::max(slots[p], max_slots(static_cast<std::uint64_t>(room), groups[p].slot_sizes, g));
    leftover -=
        static_cast<std::int64_t>(grains_for(slots[p], groups[p].slot_sizes, g)) - static_cast<std::int64_t>(used);
  }
  return slots;
}

}  // namespace

std::uint64_t gpu_granularity(std::uint64_t quota) {
  const int exponent = quota < kGiB ? 0 : std::min(4, bit_length(quota) - 1 - 30);
  return (2 * kMiB) << exponent;
}

std::uint64_t tier_granularity(CacheTier tier, std::uint64_t quota) {
  switch (tier) {
    case CacheTier::kGpu:
      return gpu_granularity(quota);
    case CacheTier::kHost:
      return 4 * 1024;
    case CacheTier::kDisk:
      return 2 * kMiB;
  }
  return gpu_granularity(quota);
}

const char* tier_name(CacheTier tier) {
  switch (tier) {
    case CacheTier::kGpu:
      return "device";
    case CacheTier::kHost:
      return "host";
    case CacheTier::kDisk:
      return "disk";
  }
  return "device";
}

std::uint64_t grains_for(std::uint64_t slots, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t granularity) {
  std::uint64_t total = 0;
  for (std::uint64_t size : slot_sizes) total += ceil_div(slots * size, granularity);
  return total;
}

std::uint64_t max_slots(std::uint64_t grains, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t granularity) {
  const std::uint64_t largest = *std::max_element(slot_sizes.begin(), slot_sizes.end());
  std::uint64_t lo = 0, hi = grains * granularity / largest;  // the largest pool alone bounds it
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo + 1) / 2;  // lo + hi + 1 wraps when hi is near 2**64
    if (grains_for(mid, slot_sizes, granularity) <= grains) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

std::int64_t slots_for_batch(const LifeCycleRegistry& registry, int layer_group, const BatchDesc& batch,
                             const ScratchRule* scratch) {
  if (!registry.kind(layer_group).has_block_pages())
    return static_cast<std::int64_t>(batch.kv_caches.size());  // a state each
  const std::int64_t tokens_per_block = registry.tokens_per_block();
  const std::int64_t sys_blocks = batch.system_prompt_length / tokens_per_block;
  // Counted as ranges, never block by block: a system prompt may span 2**40 blocks. A request's
  // live system-prompt blocks are [0, m) less its stale range [begin, end) and its scratch range
  // [a, b) (which lies above the stale one): at most three ranges.
  std::vector<std::pair<std::int64_t, std::int64_t>> shared;
  std::int64_t total = 0;
  for (const KVCacheDesc& desc : batch.kv_caches) {
    const std::int64_t num_blocks = ceil_div(desc.capacity, tokens_per_block);
    const auto [begin, end] = registry.stale_range(layer_group, desc.history_length);
    const std::int64_t stale = std::max<std::int64_t>(0, std::min(end, num_blocks) - std::min(begin, num_blocks));
    const auto [a, b] =
        scratch == nullptr ? std::pair{end, end} : scratch->range(registry, desc.capacity, desc.history_length);
    const std::int64_t m = std::min(sys_blocks, num_blocks);
    std::int64_t live_sys = 0;
    auto live = [&](std::int64_t lo, std::int64_t hi) {
      if (lo >= hi) return;
      shared.emplace_back(lo, hi);
      live_sys += hi - lo;
    };
    if (begin >= end) {
      live(0, std::min(m, a));
      live(std::max<std::int64_t>(b, 0), m);
    } else {
      live(0, std::min(m, begin));
      live(std::max<std::int64_t>(end, 0), std::min(m, a));
      live(std::max({b, end, std::int64_t{0}}), m);
    }
    total += num_blocks - stale - (b - a) + (scratch == nullptr ? 0 : scratch->slots(b - a)) - live_sys;
  }
  return total + union_length(std::move(shared));
}

std::int64_t sequence_peak_slots(const LifeCycleRegistry& registry, int layer_group, std::int64_t length) {
  const std::int64_t last = length - 1;
  std::int64_t need = slots_for_batch(registry, layer_group, BatchDesc{{KVCacheDesc{length, last}}, 0});
  if (const auto h = registry.kind(layer_group).peak_history(last)) {
    need = std::max(need, slots_for_batch(registry, layer_group, BatchDesc{{KVCacheDesc{*h + 1, *h}}, 0}));
  }
  return need;
}

std::int64_t clamp_max_seq_len(const LifeCycleRegistry& registry, const StorageConfig& storage,
                               const std::vector<std::uint64_t>& slots, std::int64_t batch_size,
                               std::int64_t upper_bound) {
  const std::int64_t tokens_per_block = registry.tokens_per_block();
  const auto fits = [&](std::int64_t length) {
    for (const PoolGroupConfig& pg : storage.pool_groups()) {
      std::int64_t need = 0;
      for (int group : pg.life_cycles) need += batch_size - 1 + sequence_peak_slots(registry, group, length);
      if (static_cast<std::uint64_t>(need) > slots[static_cast<std::size_t>(pg.index)]) return false;
    }
    return true;
  };
  std::int64_t lo = 0;
  std::int64_t hi = upper_bound / tokens_per_block;  // in blocks: lo fits (0: nothing), nothing above hi does
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid * tokens_per_block)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo * tokens_per_block;
}

SlotCounts::SlotCounts(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry,
                       const StorageConfig& storage, int level, std::optional<std::uint64_t> quota_override,
                       const std::optional<std::vector<double>>& ratio_override) {
  const CacheTierConfig& tier = config.cache_tiers.at(level);
  const std::uint64_t requested = quota_override.value_or(tier.quota);
  const std::uint64_t g = tier_granularity(tier.tier, requested);
  granularity = g;
  min_slots = compute_min_slots(config, registry, storage);
  // before the ratio, as in Python
  const std::uint64_t least = kvcore::min_quota(min_slots, storage.pool_groups(), g, tier_name(tier.tier));
  this->min_quota = least;
  const std::vector<double> ratio =
      ratio_override ? *ratio_override : initial_ratio(config, registry, storage, min_slots);
  quota = std::max(least, ceil_div(requested, g) * g);
  slots = distribute(ratio, min_slots, storage.pool_groups(), quota / g, g);
}

}  // namespace kvcore
