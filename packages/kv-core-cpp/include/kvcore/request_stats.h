// Statistics beyond the manager's CacheStats (docs/manager.md, "Statistics"; mirrors
// request_stats.py): excluded and dirty cache ids, per-layer-group and SSM-snapshot iteration
// counters (StatsBook, one per manager) and each cache's pending per-request stats (RequestStats,
// one per cache).
//
// The manager owns its StatsBook, which borrows the manager's CacheContext; a cache owns its
// RequestStats, which borrows the StatsBook (the manager outlives the cache's use of it). Every
// member of both REQUIRES: the manager's lock, except a RequestStats' fixed fields (cache_id,
// expected_prompt_length, text_only); first_digest and throw_text_only touch no state. The thread
// rule: docs/architecture.md, Threads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvcore/cache_context.h"
#include "kvcore/reuse_report.h"
#include "kvcore/tokens.h"

namespace kvcore {

struct KVCacheStatsDelta {
  std::uint64_t lookup_tokens = 0;
  std::uint64_t reused_tokens = 0;
  std::uint64_t allocated_pages = 0;
  std::uint64_t generation_allocated_pages = 0;
  std::uint64_t committed_blocks = 0;
};

struct LifeCycleStats {
  std::uint64_t allocated_pages = 0;
  std::uint64_t committed_pages = 0;
};

struct SsmSnapshotStats {
  std::uint64_t stored = 0;
  std::uint64_t skipped = 0;
  std::uint64_t reused = 0;
};

// The manager's side: which ids are excluded or dirty, and the counters the caches feed.
class StatsBook {
 public:
  explicit StatsBook(CacheContext& context);

  std::map<int, LifeCycleStats> take_life_cycle_stats();
  SsmSnapshotStats take_ssm_stats();

  CacheContext& context;
  std::vector<bool> is_ssm;  // per layer group
  // Ids stay excluded for the manager's life: the ids it hands out never repeat.
  std::set<std::int64_t> excluded;
  std::set<std::int64_t> dirty;
  std::vector<LifeCycleStats> layer_group_stats;  // per layer group
  SsmSnapshotStats ssm;
};

// The position of the first digest token, if any (a text-only cache refuses them).
std::optional<std::size_t> first_digest(const Tokens& tokens);
// Error(kValue) "<where>: token <position> is a multimodal digest, ..."
[[noreturn]] void throw_text_only(const char* where, std::size_t position);

// One cache's feed: the manager's statistics unless its id is excluded, and its own pending delta
// when it was created with enable_request_stats.
class RequestStats {
 public:
  RequestStats(StatsBook& book, std::int64_t cache_id, bool enabled, std::int64_t expected_prompt_length,
               bool text_only);

  // `misses`: why the rest of the prompt missed (nullptr with reuse_report off).
  void created(std::uint64_t lookup_tokens, std::uint64_t reused_tokens, bool reused_snapshot, const Misses* misses);
  // Pages for `needs` (ordinal, layer group) were handed to the cache.
  void allocated(const std::vector<std::pair<std::int64_t, int>>& needs);
  void committed_block();
  void attached(int layer_group);  // one of the cache's pages entered the tree in `layer_group`
  // A commit found no room to copy its states in `layer_groups` (SSM ones count).
  void snapshot_skipped(const std::vector<int>& layer_groups);
  KVCacheStatsDelta commit();  // Error(kLogic) unless enabled
  void discard();              // Error(kLogic) unless enabled

  std::int64_t cache_id() const { return cache_id_; }
  std::int64_t expected_prompt_length() const { return expected_prompt_length_; }
  bool text_only() const { return text_only_; }
  bool excluded = false;  // kept in step by the manager's mark_stats_excluded

 private:
  void add_pending(const KVCacheStatsDelta& delta);
  void require_enabled(const char* api) const;

  StatsBook& book_;
  std::int64_t cache_id_;
  bool enabled_;
  std::int64_t expected_prompt_length_;
  bool text_only_;
  std::int64_t first_generation_block_;  // a block starting at or past it holds generated tokens only
  KVCacheStatsDelta pending_;
};

}  // namespace kvcore
