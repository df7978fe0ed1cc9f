// The manager's configuration, as plain data (the binding reads kv_api's validated config). The
// manager keeps its own copy, never changed after construction, which any thread may read
// without the lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvcore/tokens.h"

namespace kvcore {

struct BufferConfig {
  std::string role;
  std::uint64_t size = 0;  // bytes per block at the override's granularity
  std::optional<std::uint64_t> tokens_per_block_override;
};

struct LayerConfig {
  std::int64_t layer_id = 0;
  std::vector<BufferConfig> buffers;
  std::optional<std::int64_t> sliding_window_size;
  std::optional<std::int64_t> num_sink_tokens;
  bool ssm = false;
};

struct KVCacheDesc {
  std::int64_t capacity = 0;
  std::int64_t history_length = 0;
};

struct BatchDesc {
  std::vector<KVCacheDesc> kv_caches;
  std::int64_t system_prompt_length = 0;
};

// What names a remote tier's values (kv_api.block_value computes both, so that every backend's
// are byte-identical): the prefix of every store key and the layout fingerprint in each header.
struct RemoteTierConfig {
  std::string store_namespace;
  std::string fingerprint;  // 32 bytes
};

// kv_api.CacheTier's values.
enum class CacheTier { kGpu = 0, kHost = 1, kDisk = 2 };

struct CacheTierConfig {
  CacheTier tier = CacheTier::kGpu;
  std::uint64_t quota = 0;
  std::string path;  // the disk tier's directory
};

struct SwaScratchReuseConfig {
  std::int64_t max_rewind_len = 0;
};

struct KVCacheManagerConfig {
  std::int64_t tokens_per_block = 32;
  std::vector<CacheTierConfig> cache_tiers;     // warm to cold: the device tier first (the local ones)
  std::optional<RemoteTierConfig> remote_tier;  // below the last local tier (remote_tier.h)
  std::vector<LayerConfig> layers;
  double max_util_for_resume = 0.97;
  bool enable_partial_reuse = true;
  std::int64_t reuse_match_backoff = 0;
  std::vector<BatchDesc> constraints;
  std::optional<BatchDesc> typical_step;
  std::optional<std::vector<double>> initial_pool_ratio;
  bool commit_min_snapshot = false;
  bool text_only = false;  // a cache refuses digest tokens unless create_kv_cache says otherwise
  std::optional<SwaScratchReuseConfig> swa_scratch_reuse;
  KeyFormat key_format = kDefaultKeyFormat;
  bool populate_memory = true;  // commit pool memory as slots are handed out (MemoryPool::populate)
  // Miss attribution (reuse_report.h).
  bool reuse_report = true;
  std::int64_t ghost_record_blocks = 65536;
  bool reuse_report_other_scope = false;
  // The auto-tuner (rebalancer.h).
  std::uint64_t rebalance_min_sampled_kv_caches = 2000;
  double rebalance_cooldown_secs = 120;
  std::uint64_t rebalance_target_ratio_update_interval = 100;
  double rebalance_ratio_threshold = 1.25;
  double rebalance_moving_average_decay = 0.9999;
};

}  // namespace kvcore
