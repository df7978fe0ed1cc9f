// The KV-cache manager (docs/manager.md; mirrors manager.py and manager_reuse.py): it owns its
// config copy, the layer groups' registry, the storage (levels, pools, page records), the radix
// tree, the CacheContext its caches work through and the statistics; it borrows the event manager
// and the page copier, which must outlive it. Its caches are the caller's (unique_ptr), closed
// before the manager goes (the binding keeps the manager alive while a cache lives).
//
// Guarantees: a call that returns false or throws leaves the manager as it was, except where a
// member says otherwise; an error of a level's memory or files carries the level (Error::level).
// Threads: every public member takes the manager's lock (docs/architecture.md, "Threads");
// members marked REQUIRES expect it held. The config and registry are fixed once built.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "kvcore/cache_context.h"
#include "kvcore/config.h"
#include "kvcore/event_manager.h"
#include "kvcore/kv_cache.h"
#include "kvcore/life_cycles.h"
#include "kvcore/poison.h"
#include "kvcore/radix_tree.h"
#include "kvcore/remote_tier.h"
#include "kvcore/request_stats.h"
#include "kvcore/reuse_report.h"
#include "kvcore/slot_counts.h"
#include "kvcore/storage.h"
#include "kvcore/storage_config.h"

namespace kvcore {

class KVCacheManager {
 public:
  // `copier` (nullptr: host-memory copies) moves page bytes between memory tiers; `store` is the
  // remote tier's (config.remote_tier; nullptr: none). The caller keeps both alive.
  KVCacheManager(const KVCacheManagerConfig& config, KVCacheEventManager* events, PageCopier* copier = nullptr,
                 BlockStore* store = nullptr);
  ~KVCacheManager();
  KVCacheManager(const KVCacheManager&) = delete;
  KVCacheManager& operator=(const KVCacheManager&) = delete;

  const KVCacheManagerConfig& config() const { return config_; }
  std::int64_t tokens_per_block() const { return config_.tokens_per_block; }
  const LifeCycleRegistry& registry() const { return registry_; }
  const StorageConfig& storage_config() const { return storage_config_; }
  const SlotCounts& counts(int level = 0) const { return storage_.level(level).counts; }
  int num_levels() const { return storage_.num_levels(); }
  Storage& storage() { return storage_; }
  // Its lock is the one every public call takes.
  CacheContext& context() { return context_; }

  // The memory layout of one buffer (docs/manager.md, "Page addresses"). REQUIRES: the manager's
  // lock; `p` is storage_config().placement(layer, role) (the binding checks both).
  struct BufferLocation {
    int pool_group;
    int pool;
    std::uint64_t page_stride;
  };
  BufferLocation buffer_location(const BufferPlacement& p) const;
  // The pool's address (PER_LAYER), plus the buffer's offset in a slot when `shared`.
  std::uintptr_t mem_pool_base_address(const BufferPlacement& p, bool shared);
  // Exclusive bound of the buffer's page indices at the device level's slot count now.
  std::int64_t page_index_upper_bound(const BufferPlacement& p) const;
  // The layer ids of each layer group, in registration order.
  std::vector<std::vector<std::int64_t>> layer_grouping() const;
  void require_live() const;  // Error(kInvalidState) after shutdown

  // `expected_prompt_length` nullopt: the tokens; `text_only` nullopt: the config's (Error(kValue)
  // for a digest token when set); `max_reused_tokens`: at most that many tokens reused (the
  // probes take it too), cut off the match's tail after the config's backoff.
  std::unique_ptr<KVCache> create_kv_cache(const ReuseScope& scope, const Tokens& tokens,
                                           std::optional<std::int64_t> id, PriorityCallback priority,
                                           std::optional<std::int64_t> expected_prompt_length = std::nullopt,
                                           std::optional<bool> text_only = std::nullopt,
                                           bool enable_request_stats = false,
                                           std::optional<std::int64_t> max_reused_tokens = std::nullopt);
  std::int64_t probe_reuse(const ReuseScope& scope, const Tokens& tokens,
                           std::optional<std::int64_t> max_reused = std::nullopt);
  // The match with its diagnostics (see kv_api.stats.ReuseMatch).
  struct ReuseMatch {
    std::int64_t num_lookup_tokens;
    std::int64_t num_divergence_tokens;
    std::int64_t num_attention_tokens;
    std::int64_t num_reused_tokens;
  };
  ReuseMatch probe_reuse_match(const ReuseScope& scope, const Tokens& tokens,
                               std::optional<std::int64_t> max_reused = std::nullopt);
  std::optional<Digest> probe_first_new_block_key(const ReuseScope& scope, const Tokens& tokens,
                                                  std::optional<std::int64_t> max_reused = std::nullopt);
  std::vector<StorageStatistics> get_storage_statistics(int level = 0);
  // Changes a level's quota with every cache suspended (the binding checks the state and the
  // arguments): false, nothing changed, below the minimum quota or when the pages that must stay
  // cannot fit.
  bool resize(int level, std::uint64_t quota);
  // The auto-tuner (rebalancer.h): whether adjust() is due; adjust() re-splits the device quota by
  // the learnt ratio with every cache suspended (the binding checks that), as resize() does.
  // Whether any slot count changed; restarts the cooldown.
  bool need_adjustment();
  bool adjust();
  std::size_t num_active_caches() const;
  std::vector<std::pair<std::pair<int, int>, std::uint64_t>> get_bytes_moved();
  void clear_reusable_blocks();
  void shutdown();
  std::size_t num_open_kv_caches() const { return context_.num_open_caches(); }
  // +1 at every device-level resize or adjust() that took effect: the pools may have moved.
  std::int64_t layout_version() const { return layout_version_; }

  CacheStats get_committed_stats();
  CacheStats get_and_reset_iteration_stats();
  std::map<int, LifeCycleStats> get_and_reset_iteration_stats_by_life_cycle();
  SsmSnapshotStats get_and_reset_ssm_snapshot_iteration_stats();
  std::vector<std::uint64_t> get_and_reset_iteration_peak_block_stats(int level);
  // The binding checks the ids (in [0, kCacheIdLimit)).
  void mark_stats_excluded(std::int64_t cache_id);
  bool is_stats_excluded(std::int64_t cache_id);
  void mark_stats_dirty(std::int64_t cache_id);
  void clear_stats_dirty(std::int64_t cache_id);
  std::vector<std::int64_t> get_dirty_stats_kv_cache_ids();
  // See clamp_max_seq_len (slot_counts.h), against the device level's slots now.
  std::int64_t clamp_max_seq_len_for_mem(std::int64_t batch_size, std::int64_t token_upper_bound);

 private:
  MatchPath match(const Digest& root_key, const Tokens& tokens, bool with_backoff = true,
                  std::optional<std::int64_t> max_reused = std::nullopt);
  // create_kv_cache's match: match()'s, its walk continued in the remote tier before backing
  // off; `fetched` gets the blocks the remote tier brought, `misses` why the rest missed (left
  // empty with reuse_report off).
  MatchPath match_fetching(const Digest& root_key, const ReuseScope& scope, const Tokens& tokens,
                           std::optional<std::int64_t> max_reused, std::vector<const Block*>& fetched,
                           std::optional<Misses>& misses);
  // Extends `path` past its full blocks with the remote tier's (a partial last block of the
  // local walk gives way to a full one from the store), up to `max_reused` tokens.
  std::vector<const Block*> fetch_remote(const Digest& root_key, const ReuseScope& scope, const Tokens& tokens,
                                         MatchPath& path, std::optional<std::int64_t> max_reused);
  // reuse_match_backoff tokens off the tail, then down to `max_reused` tokens
  MatchPath back_off(MatchPath path, std::optional<std::int64_t> max_reused) const;
  // Cut until the path ends on an SSM snapshot taken there (unless `ssm` is false: the
  // attention-only length) and every attention layer group's needed pages cover the match.
  MatchPath prune(MatchPath path, bool ssm = true) const;
  bool prune_ssm(MatchPath& path) const;
  void require_no_open_caches(const char* api) const;
  bool resize_level(int level, const SlotCounts& counts);  // the caller holds the lock

  // First: its constructor checks the poison latch before anything is built, and a member that
  // fails to build counts the manager down again. take_poison() waits until it is released.
  poison::LiveManager live_;
  KVCacheManagerConfig config_;
  LifeCycleRegistry registry_;
  StorageConfig storage_config_;
  RadixTree tree_;
  KVCacheEventManager* events_;
  Storage storage_;
  CacheContext context_;  // the lock, the open caches, the shut-down flag and the statistics, shared with the caches
  StatsBook stats_;       // excluded and dirty ids, per-layer-group counters
  std::unique_ptr<RemoteTier> remote_;  // where configured; the context points to it
  std::int64_t next_id_ = 0;
  std::int64_t layout_version_ = 0;  // successful device-level resizes and adjustments
  std::uint64_t evicted_mark_ = 0;
  std::uint64_t onboarded_mark_ = 0;
  std::uint64_t corrupt_mark_ = 0;
  std::uint64_t disk_full_mark_ = 0;
};

}  // namespace kvcore
