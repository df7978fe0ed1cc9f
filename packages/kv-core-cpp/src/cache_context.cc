#include "kvcore/cache_context.h"

#include <algorithm>

namespace kvcore {

namespace {

void add(CacheStats& to, const CacheStats& d) {
  to.requests += d.requests;
  to.lookup_tokens += d.lookup_tokens;
  to.reused_tokens += d.reused_tokens;
  to.allocated_pages += d.allocated_pages;
  to.evicted_pages += d.evicted_pages;
  to.committed_blocks += d.committed_blocks;
  to.onboarded_pages += d.onboarded_pages;
  to.corrupt_pages += d.corrupt_pages;
  to.disk_full_events += d.disk_full_events;
  to.remote_lookups += d.remote_lookups;
  to.remote_blocks += d.remote_blocks;
  to.remote_rejected += d.remote_rejected;
  to.remote_written += d.remote_written;
  to.remote_errors += d.remote_errors;
  to.remote_skipped += d.remote_skipped;
  to.miss_stale_tokens += d.miss_stale_tokens;
  to.miss_capped_tokens += d.miss_capped_tokens;
  to.miss_evicted_tokens += d.miss_evicted_tokens;
  to.miss_partial_tokens += d.miss_partial_tokens;
  to.miss_never_seen_tokens += d.miss_never_seen_tokens;
  to.miss_other_scope_tokens += d.miss_other_scope_tokens;
}

}  // namespace

CacheContext::CacheContext(const KVCacheManagerConfig& config, const LifeCycleRegistry& registry, Storage& storage,
                           RadixTree& tree, KVCacheEventManager* events)
    : rebalancer(config, registry, storage.config()),
      tokens_per_block_(config.tokens_per_block),
      key_format_(config.key_format),
      max_util_for_resume_(config.max_util_for_resume),
      commit_min_snapshot_(config.commit_min_snapshot),
      swa_scratch_reuse_(config.swa_scratch_reuse),
      scratch_(scratch_rules(config, registry, storage.config())),
      registry_(registry),
      storage_(storage),
      tree_(tree),
      events_(events) {}

void CacheContext::add_stats(const CacheStats& delta) {
  add(committed_stats, delta);
  add(iteration_stats, delta);
}

void CacheContext::register_cache(KVCache* cache) { open_caches_.push_back(cache); }

void CacheContext::unregister_cache(KVCache* cache) {
  open_caches_.erase(std::remove(open_caches_.begin(), open_caches_.end(), cache), open_caches_.end());
}

}  // namespace kvcore
