// What a KV cache works through: the part of its manager's state a cache reads and changes
// (docs/manager.md, "A cache and its manager"; mirrors cache_context.py).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "kvcore/config.h"
#include "kvcore/event_manager.h"
#include "kvcore/life_cycles.h"
#include "kvcore/poison.h"
#include "kvcore/radix_tree.h"
#include "kvcore/rebalancer.h"
#include "kvcore/scratch.h"
#include "kvcore/storage.h"

namespace kvcore {

class KVCache;
class RemoteTier;

struct CacheStats {
  std::uint64_t requests = 0;
  std::uint64_t lookup_tokens = 0;
  std::uint64_t reused_tokens = 0;
  std::uint64_t allocated_pages = 0;
  std::uint64_t evicted_pages = 0;
  std::uint64_t committed_blocks = 0;
  std::uint64_t onboarded_pages = 0;
  std::uint64_t corrupt_pages = 0;
  std::uint64_t disk_full_events = 0;
  std::uint64_t remote_lookups = 0;
  std::uint64_t remote_blocks = 0;
  std::uint64_t remote_rejected = 0;
  std::uint64_t remote_written = 0;
  std::uint64_t remote_errors = 0;
  std::uint64_t remote_skipped = 0;
  std::uint64_t miss_stale_tokens = 0;
  std::uint64_t miss_capped_tokens = 0;
  std::uint64_t miss_evicted_tokens = 0;
  std::uint64_t miss_partial_tokens = 0;
  std::uint64_t miss_never_seen_tokens = 0;
  std::uint64_t miss_other_scope_tokens = 0;
};

// Built by the manager, which owns it, and handed to each cache it creates. The manager works
// through it too for the state they share: the lock, the open caches, the shut-down flag and the
// statistics. It owns the mutex, the statistics, the rebalancer and the list of open caches
// (pointers: a cache unregisters itself when it closes, or is destroyed open). The registry,
// storage and tree it refers to are the manager's, declared before it, so they outlive it; the
// event manager is the manager's caller's.
//
// Threads: lock() is the manager's lock (the thread rule: docs/architecture.md, Threads). The
// config values, the scratch rules, registry() and which storage, tree and event manager it
// refers to are fixed at construction and need no lock (what the storage and the tree hold does,
// and the event manager's hooks); every other member REQUIRES: the manager's lock.
class CacheContext {
 public:
  CacheContext(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry, Storage& storage, RadixTree& tree,
               KVCacheEventManager* events);
  CacheContext(const CacheContext&) = delete;
  CacheContext& operator=(const CacheContext&) = delete;

  // Taken by every public call of the manager and its caches; held while the guard lives. Being
  // the one way in, it checks the poison latch first (Error(kCorrupted) once poisoned).
  [[nodiscard]] std::unique_lock<std::recursive_mutex> lock() {
    poison::check();
    return std::unique_lock<std::recursive_mutex>(mutex_);
  }
  // The same lock without waiting (owns_lock() says whether it was taken): the binding tries it
  // holding the GIL and waits for it only after releasing the GIL. Checks the latch as lock() does.
  [[nodiscard]] std::unique_lock<std::recursive_mutex> try_lock() {
    poison::check();
    return std::unique_lock<std::recursive_mutex>(mutex_, std::try_to_lock);
  }
  // The lock without the check, for destructors, which must not throw.
  [[nodiscard]] std::unique_lock<std::recursive_mutex> lock_unchecked() {
    return std::unique_lock<std::recursive_mutex>(mutex_);
  }

  // The config values a cache reads.
  std::int64_t tokens_per_block() const { return tokens_per_block_; }
  KeyFormat key_format() const { return key_format_; }
  double max_util_for_resume() const { return max_util_for_resume_; }
  bool commit_min_snapshot() const { return commit_min_snapshot_; }
  // Sliding-window scratch: configured or not, and per layer group its rule (none: never).
  const std::optional<SwaScratchReuseConfig>& swa_scratch_reuse() const { return swa_scratch_reuse_; }
  const ScratchRule* scratch(int layer_group) const {
    return scratch_[layer_group] ? &*scratch_[layer_group] : nullptr;
  }

  const LifeCycleRegistry& registry() const { return registry_; }
  Storage& storage() { return storage_; }
  RadixTree& tree() { return tree_; }
  KVCacheEventManager* events() { return events_; }  // nullptr: no event manager

  void add_stats(const CacheStats& delta);  // to the committed and the iteration statistics
  // One counter of both: a delta record built field by field on the stack and read back as
  // vectors stalls on store forwarding, a cost per committed block.
  void count(std::uint64_t CacheStats::* counter, std::uint64_t n) {
    committed_stats.*counter += n;
    iteration_stats.*counter += n;
  }
  // A cache is open from its creation until it unregisters itself on close.
  void register_cache(KVCache* cache);
  void unregister_cache(KVCache* cache);
  std::size_t num_open_caches() const { return open_caches_.size(); }
  const std::vector<KVCache*>& open_caches() const { return open_caches_; }

  bool is_shut_down = false;  // set by the manager's shutdown()
  // The manager's reuse match without reuse_match_backoff (set by the manager): a planned drop
  // re-matches the committed tokens (planned_drop.h).
  std::function<MatchPath(const Digest&, const Tokens&)> rematch;
  RemoteTier* remote = nullptr;  // the remote tier, set by the manager (which owns it) where configured
  Rebalancer rebalancer;         // closing caches feed it
  CacheStats committed_stats;
  CacheStats iteration_stats;

 private:
  std::recursive_mutex mutex_;
  std::int64_t tokens_per_block_;
  KeyFormat key_format_;
  double max_util_for_resume_;
  bool commit_min_snapshot_;
  std::optional<SwaScratchReuseConfig> swa_scratch_reuse_;
  std::vector<std::optional<ScratchRule>> scratch_;
  const LifeCycleRegistry& registry_;
  Storage& storage_;
  RadixTree& tree_;
  KVCacheEventManager* events_;
  std::vector<KVCache*> open_caches_;  // in creation order
};

}  // namespace kvcore
