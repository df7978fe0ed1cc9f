#include "kvcore/manager.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kvcore/error.h"
#include "kvcore/ghost_record.h"
#include "kvcore/scope_free_index.h"

namespace kvcore {

namespace {

KVCacheEventManager* bind_events(KVCacheEventManager* events, const LifeCycleRegistry& registry) {
  if (events != nullptr) {
    std::vector<std::optional<std::int64_t>> windows;
    for (const LifeCycle& life : registry.life_cycles()) windows.push_back(life.window);
    events->bind(std::move(windows));
  }
  return events;
}

}  // namespace

KVCacheManager::KVCacheManager(const KVCacheManagerConfig& config, KVCacheEventManager* events, PageCopier* copier,
                               BlockStore* store)
    : config_(config),
      registry_(config_),
      storage_config_(config_, registry_),
      tree_(registry_.size(), config_.tokens_per_block),
      events_(bind_events(events, registry_)),
      storage_(config_, storage_config_, registry_, tree_, events_, copier),
      context_(config_, registry_, storage_, tree_, events_),
      stats_(context_) {
  if (config_.reuse_report) {
    tree_.ghost = std::make_unique<GhostRecord>(config_.ghost_record_blocks);
    if (config_.reuse_report_other_scope)
      tree_.scope_free = std::make_unique<ScopeFreeIndex>(config_.tokens_per_block, config_.key_format);
  }
  if (config_.remote_tier && store != nullptr) {
    remote_ = std::make_unique<RemoteTier>(*config_.remote_tier, config_, context_, *store);
    context_.remote = remote_.get();
  }
  // The manager owns the context, so the context never calls a destroyed manager.
  context_.rematch = [this](const Digest& key, const Tokens& tokens) { return match(key, tokens, false); };
  if (events_ != nullptr) {
    // Unbound by the destructor, so the event manager never calls a destroyed manager.
    events_->set_resync([this] {
      const auto lock = context_.lock();
      std::vector<std::uint64_t> totals;
      for (int l = 0; l < storage_.num_levels(); ++l) totals.push_back(storage_.level(l).total_slots());
      events_->resync_to(std::move(totals), tree_.roots());
    });
    std::vector<std::uint64_t> totals;
    for (int l = 0; l < storage_.num_levels(); ++l) totals.push_back(storage_.level(l).total_slots());
    events_->created(std::move(totals));
  }
}

KVCacheManager::~KVCacheManager() {
  if (events_ != nullptr) events_->set_resync(nullptr);
  storage_.close();
}

void KVCacheManager::require_live() const {
  if (context_.is_shut_down) throw Error(ErrorKind::kInvalidState, "the manager is shut down");
}

std::vector<StorageStatistics> KVCacheManager::get_storage_statistics(int level) {
  const auto lock = context_.lock();
  require_live();
  return storage_.statistics(level);
}

std::vector<std::pair<std::pair<int, int>, std::uint64_t>> KVCacheManager::get_bytes_moved() {
  const auto lock = context_.lock();
  return storage_.transfer().bytes_moved();
}

KVCacheManager::BufferLocation KVCacheManager::buffer_location(const BufferPlacement& p) const {
  return {storage_config_.pool_group_of(p.layer_group), p.pool, p.page_size};
}

std::uintptr_t KVCacheManager::mem_pool_base_address(const BufferPlacement& p, bool shared) {
  const int group = storage_config_.pool_group_of(p.layer_group);
  const auto base = reinterpret_cast<std::uintptr_t>(storage_.pool_groups()[group].pools[p.pool].data());
  return base + (shared ? static_cast<std::uint64_t>(p.position) * p.size : 0);
}

std::int64_t KVCacheManager::page_index_upper_bound(const BufferPlacement& p) const {
  const auto slots = static_cast<std::int64_t>(counts().slots[storage_config_.pool_group_of(p.layer_group)]);
  return (p.scale * slots - p.position) * p.expansion;
}

std::vector<std::vector<std::int64_t>> KVCacheManager::layer_grouping() const {
  std::vector<std::vector<std::int64_t>> groups(registry_.size());
  for (const auto& [layer, group] : registry_.layers()) groups[group].push_back(layer);
  return groups;
}

std::size_t KVCacheManager::num_active_caches() const {
  std::size_t n = 0;
  for (const KVCache* c : context_.open_caches()) n += c->status() == CacheStatus::kActive;
  return n;
}

bool KVCacheManager::resize(int level, std::uint64_t quota) {
  const auto lock = context_.lock();
  // The device keeps the split the auto-tuner gave it.
  const SlotCounts counts = [&] {
    try {
      return SlotCounts(config_, registry_, storage_config_, level, quota,
                        level == 0 ? context_.rebalancer.applied : std::nullopt);
    } catch (Error& e) {
      at_level(e, level);
      throw;
    }
  }();
  if (quota < counts.min_quota) return false;
  return resize_level(level, counts);
}

bool KVCacheManager::resize_level(int level, const SlotCounts& counts) {
  // Every page the tree or an open cache has (make_room may drop some: the plan skips the dead).
  std::vector<Page*> live;
  for (Root* root : tree_.roots()) {
    for (Block* child : root->children()) {
      for (Block* b : RadixTree::subtree(child)) {
        for (Page* p : b->pages) {
          if (p != nullptr) live.push_back(p);
        }
      }
    }
  }
  for (const KVCache* c : context_.open_caches()) {
    for (Page* p : c->held_pages()) live.push_back(p);
  }
  std::sort(live.begin(), live.end());
  live.erase(std::unique(live.begin(), live.end()), live.end());
  const Storage::RecordGuard guard(storage_);  // `live` outlives make_room's drops
  try {
    storage_.resize_level(level, counts, live);
  } catch (Error& e) {
    if (e.kind() == ErrorKind::kOutOfPages) return false;
    at_level(e, level);
    throw;
  }
  if (level == 0) ++layout_version_;  // the device's pools may have moved
  return true;
}

bool KVCacheManager::need_adjustment() {
  const auto lock = context_.lock();
  require_live();
  return context_.rebalancer.need_adjustment(counts());
}

bool KVCacheManager::adjust() {
  const auto lock = context_.lock();
  Rebalancer& rebalancer = context_.rebalancer;
  const std::optional<SlotCounts> plan = rebalancer.plan(counts().quota);
  if (!plan) {  // nothing learnt yet
    rebalancer.adjusted(std::nullopt);
    return false;
  }
  const bool unchanged = plan->slots == counts().slots;
  const bool applied = unchanged || resize_level(0, *plan);
  rebalancer.adjusted(applied ? rebalancer.target : std::nullopt);
  return applied && !unchanged;
}

void KVCacheManager::require_no_open_caches(const char* api) const {
  if (const std::size_t n = context_.num_open_caches()) {
    throw Error(ErrorKind::kLogic, std::string(api) + "() with " + std::to_string(n) + " KV cache(s) still open");
  }
}

void KVCacheManager::clear_reusable_blocks() {
  const auto lock = context_.lock();
  require_live();
  require_no_open_caches("clear_reusable_blocks");
  storage_.clear();
}

void KVCacheManager::shutdown() {
  const auto lock = context_.lock();
  if (context_.is_shut_down) return;
  require_no_open_caches("shutdown");
  storage_.clear();
  storage_.close();
  context_.is_shut_down = true;
  live_.release();
}

CacheStats KVCacheManager::get_committed_stats() {
  const auto lock = context_.lock();
  CacheStats s = context_.committed_stats;
  s.evicted_pages = storage_.num_evicted;
  s.onboarded_pages = storage_.num_onboarded;
  s.corrupt_pages = storage_.num_corrupt;
  s.disk_full_events = storage_.num_disk_full;
  return s;
}

CacheStats KVCacheManager::get_and_reset_iteration_stats() {
  const auto lock = context_.lock();
  CacheStats s = context_.iteration_stats;
  s.evicted_pages = storage_.num_evicted - evicted_mark_;
  s.onboarded_pages = storage_.num_onboarded - onboarded_mark_;
  s.corrupt_pages = storage_.num_corrupt - corrupt_mark_;
  s.disk_full_events = storage_.num_disk_full - disk_full_mark_;
  context_.iteration_stats = CacheStats{};
  evicted_mark_ = storage_.num_evicted;
  onboarded_mark_ = storage_.num_onboarded;
  corrupt_mark_ = storage_.num_corrupt;
  disk_full_mark_ = storage_.num_disk_full;
  return s;
}

std::map<int, LifeCycleStats> KVCacheManager::get_and_reset_iteration_stats_by_life_cycle() {
  const auto lock = context_.lock();
  return stats_.take_life_cycle_stats();
}

SsmSnapshotStats KVCacheManager::get_and_reset_ssm_snapshot_iteration_stats() {
  const auto lock = context_.lock();
  return stats_.take_ssm_stats();
}

std::vector<std::uint64_t> KVCacheManager::get_and_reset_iteration_peak_block_stats(int level) {
  const auto lock = context_.lock();
  require_live();
  std::vector<std::uint64_t> out;
  for (PoolGroup& pg : storage_.level(level).pool_groups) out.push_back(pg.allocator.take_peak());
  return out;
}

void KVCacheManager::mark_stats_excluded(std::int64_t cache_id) {
  const auto lock = context_.lock();
  stats_.excluded.insert(cache_id);
  for (KVCache* cache : context_.open_caches()) {
    if (cache->stats.cache_id() == cache_id) cache->stats.excluded = true;
  }
}

bool KVCacheManager::is_stats_excluded(std::int64_t cache_id) {
  const auto lock = context_.lock();
  return stats_.excluded.count(cache_id) != 0;
}

void KVCacheManager::mark_stats_dirty(std::int64_t cache_id) {
  const auto lock = context_.lock();
  stats_.dirty.insert(cache_id);
}

void KVCacheManager::clear_stats_dirty(std::int64_t cache_id) {
  const auto lock = context_.lock();
  stats_.dirty.erase(cache_id);
}

std::vector<std::int64_t> KVCacheManager::get_dirty_stats_kv_cache_ids() {
  const auto lock = context_.lock();
  return {stats_.dirty.begin(), stats_.dirty.end()};
}

std::int64_t KVCacheManager::clamp_max_seq_len_for_mem(std::int64_t batch_size, std::int64_t token_upper_bound) {
  const auto lock = context_.lock();
  require_live();
  return clamp_max_seq_len(registry_, storage_config_, counts().slots, batch_size, token_upper_bound);
}

}  // namespace kvcore
