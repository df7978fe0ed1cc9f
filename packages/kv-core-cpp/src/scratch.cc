#include "kvcore/scratch.h"

#include <algorithm>

#include "kvcore/constants.h"

namespace kvcore {

std::pair<std::int64_t, std::int64_t> ScratchRule::range(const LifeCycleRegistry& registry, std::int64_t capacity,
                                                         std::int64_t history) const {
  const std::int64_t tokens_per_block = registry.tokens_per_block();
  const auto [begin, end] = registry.stale_range(layer_group, std::max<std::int64_t>(0, capacity - max_rewind_len));
  const std::int64_t lo = std::max(begin, ceil_div(history, tokens_per_block));
  return {lo, std::max(lo, std::min(end, ceil_div(capacity, tokens_per_block)))};
}

std::int64_t ScratchRule::slots(std::int64_t num_blocks) const {
  if (layer_bytes == 0) return 0;  // layers without buffers: nothing to hold (and no slot bytes)
  // Blocks below 2**40 times bytes below 2**63: exact in 128 bits; the result is at most num_blocks.
  const unsigned __int128 bytes = static_cast<unsigned __int128>(num_blocks) * layer_bytes;
  return static_cast<std::int64_t>((bytes + slot_bytes - 1) / slot_bytes);
}

std::vector<std::optional<ScratchRule>> scratch_rules(const KVCacheManagerConfig& config,
                                                      const LifeCycleRegistry& registry, const StorageConfig& storage) {
  std::vector<std::optional<ScratchRule>> rules(registry.size());
  if (!config.swa_scratch_reuse) return rules;
  const std::int64_t tokens_per_block = config.tokens_per_block;
  std::vector<std::uint64_t> layer_bytes(registry.size(), 0);
  for (const LayerConfig& layer : config.layers) {
    if (layer.ssm) continue;
    std::uint64_t size = 0;  // below 2**63: the config checks one block of every buffer
    for (const BufferConfig& b : layer.buffers) {
      size += b.size * (b.tokens_per_block_override
                            ? static_cast<std::uint64_t>(tokens_per_block) / *b.tokens_per_block_override
                            : 1);
    }
    const int group = registry.layer_group_of(layer.layer_id);
    layer_bytes[group] = std::max(layer_bytes[group], size);
  }
  for (const LifeCycle& life : registry.life_cycles()) {
    if (!registry.kind(life.id).has_scratch()) continue;
    const std::uint64_t slot_bytes = storage.pool_groups()[storage.pool_group_of(life.id)].slot_bytes();
    rules[life.id] = ScratchRule{life.id, config.swa_scratch_reuse->max_rewind_len, layer_bytes[life.id], slot_bytes};
  }
  return rules;
}

}  // namespace kvcore
