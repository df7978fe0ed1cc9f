#include "kvcore/manager.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kvcore/error.h"

namespace kvcore {

namespace {

KVCacheEventManager* bind_events(KVCacheEventManager* events, const LifeCycleRegistry& registry) {
  if (events != nullptr) {
    std::vector<std::optional<std::int64_t>> windows;
    for (const LifeCycle& lc : registry.life_cycles()) windows.push_back(lc.window);
    events->bind(std::move(windows));
  }
  return events;
}

}  // namespace

KVCacheManager::KVCacheManager(const KVCacheManagerConfig& config, KVCacheEventManager* events, PageCopier* copier)
    : config_(config),
      registry_(config_),
      storage_config_(config_, registry_),
      tree_(registry_.size()),
      events_(bind_events(events, registry_)),
      storage_(config_, storage_config_, registry_, tree_, events_, copier),
      context_(config_, registry_, storage_, tree_, events_) {
  if (events_ != nullptr) {
    std::vector<std::uint64_t> totals;
    for (int l = 0; l < storage_.num_levels(); ++l) totals.push_back(storage_.level(l).total_slots());
    events_->created(std::move(totals));
  }
}

KVCacheManager::~KVCacheManager() { storage_.close(); }

void KVCacheManager::require_live() const {
  if (context_.is_shut_down) throw Error(ErrorKind::kInvalidState, "the manager is shut down");
}

MatchPath KVCacheManager::match(const Digest& root_key, const Tokens& tokens) {
  // The reusable prefix: walk, back off, then cut until the endpoint has an SSM snapshot taken
  // exactly there and every attention life cycle has, for each block it needs at the endpoint, a
  // page covering the matched tokens.
  const std::int64_t tpb = config_.tokens_per_block;
  MatchPath path = tree_.walk(root_key, tokens, tpb, config_.key_format, config_.enable_partial_reuse);
  std::int64_t backoff = config_.reuse_match_backoff;
  while (backoff && !path.empty()) {
    auto& [block, n] = path.back();
    if (n > backoff) {
      n -= backoff;
      backoff = 0;
    } else {
      backoff -= n;
      path.pop_back();
    }
  }
  bool changed = true;
  while (changed && !path.empty()) {
    changed = prune_ssm(path);
    if (changed) continue;
    std::int64_t total = 0;
    for (const auto& step : path) total += step.second;
    for (int lc : registry_.block_life_cycles()) {
      if (changed) break;
      const auto [begin, end] = registry_.stale_range(lc, total);
      for (std::size_t o = 0; o < path.size(); ++o) {
        const auto ordinal = static_cast<std::int64_t>(o);
        if (begin <= ordinal && ordinal < end) continue;
        Block* block = path[o].first;
        const Page* page = block->pages[lc];
        const std::int64_t coverage = page ? page->num_tokens : 0;
        if (coverage < path[o].second) {
          path.resize(o);
          if (coverage) path.emplace_back(block, coverage);
          changed = true;
          break;
        }
      }
    }
  }
  return path;
}

bool KVCacheManager::prune_ssm(MatchPath& path) const {
  // Cut to the last block with an SSM snapshot inside its matched tokens, at the snapshot's
  // length (a state is valid at one position only); empty without one. Whether it changed.
  for (int lc : registry_.ssm_life_cycles()) {
    std::size_t keep = 0;
    for (std::size_t o = 0; o < path.size(); ++o) {
      const Page* page = path[o].first->pages[lc];
      if (page != nullptr && 0 < page->num_tokens && page->num_tokens <= path[o].second) keep = o + 1;
    }
    if (keep == 0) {
      path.clear();
      return true;
    }
    Block* block = path[keep - 1].first;
    const std::int64_t coverage = block->pages[lc]->num_tokens;
    if (keep < path.size() || coverage != path[keep - 1].second) {
      path.resize(keep - 1);
      path.emplace_back(block, coverage);
      return true;
    }
  }
  return false;
}

std::int64_t KVCacheManager::probe_reuse(const ReuseScope& scope, const Tokens& tokens) {
  const auto lock = context_.lock();
  require_live();
  std::int64_t total = 0;
  for (const auto& step : match(root_key(scope), tokens)) total += step.second;
  return total;
}

std::optional<Digest> KVCacheManager::probe_first_new_block_key(const ReuseScope& scope, const Tokens& tokens) {
  const auto lock = context_.lock();
  require_live();
  const Digest root = root_key(scope);
  const std::int64_t tpb = config_.tokens_per_block;
  std::int64_t reusable = 0;
  for (const auto& step : match(root, tokens)) reusable += step.second;
  const std::int64_t k = reusable / tpb;
  const auto n = static_cast<std::int64_t>(tokens.count);
  if (reusable >= n || (k + 1) * tpb > n) return std::nullopt;
  std::vector<std::uint8_t> keys(32 * static_cast<std::size_t>(k + 2));
  chained_keys(root, tokens, 0, static_cast<std::size_t>(k + 1), static_cast<std::size_t>(tpb), config_.key_format,
               keys.data());
  Digest key;
  std::memcpy(key.data(), keys.data() + 32 * static_cast<std::size_t>(k + 1), key.size());
  return key;
}

std::unique_ptr<KVCache> KVCacheManager::create_kv_cache(const ReuseScope& scope, const Tokens& tokens,
                                                         std::optional<std::int64_t> id, PriorityCallback priority) {
  const auto lock = context_.lock();
  require_live();
  const std::int64_t cache_id = id.value_or(next_id_);
  const Digest root = root_key(scope);
  const MatchPath path = match(root, tokens);
  std::int64_t reused = 0;
  for (const auto& step : path) reused += step.second;
  auto cache = std::make_unique<KVCache>(context_, cache_id, scope, root,
                                         TokenList::from(tokens, 0, static_cast<std::size_t>(reused)), path,
                                         std::move(priority));
  next_id_ = std::max(next_id_, cache_id) + 1;
  context_.register_cache(cache.get());
  CacheStats delta;
  delta.requests = 1;
  delta.lookup_tokens = tokens.count;
  delta.reused_tokens = static_cast<std::uint64_t>(reused);
  context_.add_stats(delta);
  return cache;
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

std::size_t KVCacheManager::num_active_caches() const {
  std::size_t n = 0;
  for (const KVCache* c : context_.open_caches()) n += c->status() == CacheStatus::kActive;
  return n;
}

bool KVCacheManager::resize(int level, std::uint64_t quota) {
  const auto lock = context_.lock();
  // The device keeps the split the auto-tuner gave it.
  const SlotCounts counts(config_, registry_, storage_config_, level, quota,
                          level == 0 ? context_.rebalancer.applied : std::nullopt);
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
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kOutOfPages) return false;
    throw;
  }
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
  return s;
}

CacheStats KVCacheManager::get_and_reset_iteration_stats() {
  const auto lock = context_.lock();
  CacheStats s = context_.iteration_stats;
  s.evicted_pages = storage_.num_evicted - evicted_mark_;
  s.onboarded_pages = storage_.num_onboarded - onboarded_mark_;
  context_.iteration_stats = CacheStats{};
  evicted_mark_ = storage_.num_evicted;
  onboarded_mark_ = storage_.num_onboarded;
  return s;
}

}  // namespace kvcore
