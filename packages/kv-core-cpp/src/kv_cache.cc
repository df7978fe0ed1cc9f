// One request's KV cache and its state machine (kv_cache.py): created on a matched prefix,
// resumed, suspended and closed. Its other parts are defined in the files kv_cache.h lists.
#include "kvcore/kv_cache.h"

#include <algorithm>

#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/poison.h"
#include "kvcore/prefetch.h"
#include "kvcore/remote_tier.h"

namespace kvcore {

namespace {

// How many blocks ahead close() asks for a block's pages and tree block.
constexpr std::int64_t kPrefetchBlocks = 8;

}  // namespace

KVCache::KVCache(CacheContext& context, std::int64_t id, const ReuseScope& scope, const Digest& root_key,
                 TokenList tokens, const MatchPath& path, PriorityCallback priority, RequestStats request_stats,
                 const std::vector<const Block*>& fetched, Misses* misses)
    : stats(std::move(request_stats)),
      context_(context),
      id_(id),
      scope_(scope),
      root_key_(root_key),
      priority_(std::move(priority)),
      tokens_(std::move(tokens)),
      history_(static_cast<std::int64_t>(tokens_.size())),
      capacity_(history_),
      tokens_per_block_(context.tokens_per_block()),
      num_layer_groups_(context.registry().size()),
      block_layer_groups_(context.registry().block_layer_groups()),
      full_attention_only_(
          std::none_of(context.registry().life_cycles().begin(), context.registry().life_cycles().end(),
                       [&context](const LifeCycle& life) { return context.registry().kind(life.id).goes_stale(); })),
      ssm_layer_groups_(context.registry().ssm_layer_groups()),
      num_reused_(history_),
      index_(num_layer_groups_),
      stale_scan_(num_layer_groups_, 0),
      cached_by_level_(static_cast<std::size_t>(context.storage().num_levels() + (context.remote != nullptr)), 0),
      ssm_state_(num_layer_groups_, nullptr),
      ssm_locked_(num_layer_groups_, false),
      ssm_snapshot_(num_layer_groups_, nullptr),
      scratch_on_(context.swa_scratch_reuse().has_value()),
      scratch_pages_(num_layer_groups_) {
  hold_matched(path, fetched);
  if (misses != nullptr) {
    reuse_report_ = misses->report(cached_by_level_);
    prompt_keys_ = std::move(misses->keys);
  }
}

void KVCache::hold_matched(const MatchPath& path, const std::vector<const Block*>& fetched) {
  // Priorities first: a failing callback must leave the tree untouched.
  struct Reused {
    std::int64_t ordinal;
    int layer_group;
    Page* page;
    int priority;
  };
  std::vector<Reused> reused;
  reused.reserve(path.size() * block_layer_groups_.size());
  const std::vector<Range> stale = stale_ranges(history_);
  for (std::size_t i = 0; i < path.size(); ++i) {
    const auto ordinal = static_cast<std::int64_t>(i);
    for (int group : block_layer_groups_) {
      Page* page = path[i].first->pages[group];
      if (page != nullptr && !in_range(stale[group], ordinal))
        reused.push_back({ordinal, group, page, priority_of(ordinal, group)});
    }
  }
  std::vector<Reused> snapshots;
  for (int group : ssm_layer_groups_) {
    const auto last = static_cast<std::int64_t>(path.size()) - 1;
    Page* page = path.empty() ? nullptr : path.back().first->pages[group];
    if (page != nullptr) snapshots.push_back({last, group, page, priority_of(last, group)});
  }
  std::vector<int> block_level(path.size(), 0);  // the coldest level among a block's reused pages
  for (const Reused& r : reused)
    block_level[r.ordinal] = std::max(block_level[r.ordinal], static_cast<int>(r.page->level));
  for (const Reused& r : snapshots)
    block_level[r.ordinal] = std::max(block_level[r.ordinal], static_cast<int>(r.page->level));
  const int remote_column = context_.storage().num_levels();
  for (std::size_t i = 0; i < path.size(); ++i) {
    // A block the remote tier brought for this match counts there (the last column).
    const bool brought = std::find(fetched.begin(), fetched.end(), path[i].first) != fetched.end();
    cached_by_level_[brought ? remote_column : block_level[i]] += path[i].second;
  }
  blocks_.reserve(path.size());
  for (const auto& [block, matched] : path) {
    CacheBlock& cache_block = blocks_.emplace_back(num_layer_groups_);
    if (matched == static_cast<std::int64_t>(block->tokens().size()) && matched == tokens_per_block_) {
      cache_block.tree_block = block;
      ++block->pins;
    } else {
      cache_block.copy_on_resume = true;  // a reused partial block: never written in place
    }
  }
  for (auto& index : index_) index.assign(path.size(), kBadPageIndex);
  Storage& storage = context_.storage();
  for (const Reused& r : reused) {
    storage.hold(r.page, r.priority);  // reuse may raise a block's priority
    blocks_[r.ordinal].pages[r.layer_group] = r.page;
  }
  for (const Reused& r : snapshots) {
    storage.hold(r.page, r.priority);
    ssm_snapshot_[r.layer_group] = r.page;
  }
}

KVCache::~KVCache() {
  // Only this thread can still reach a cache being destroyed, so the status needs no lock.
  if (status_ == CacheStatus::kClosed || context_.is_shut_down) return;
  const auto lock = context_.lock_unchecked();
  if (poison::reason()) {
    // Poisoned, the pages' bookkeeping cannot be trusted: the cache is dropped as it is (its pages
    // go with the manager), only unregistered so that the manager keeps no dangling pointer.
    context_.unregister_cache(this);
    return;
  }
  try {
    close_locked();
  } catch (...) {  // never throw from a destructor
  }
}

std::vector<Page*> KVCache::held_pages() const {
  std::vector<Page*> out;
  for (const CacheBlock& cache_block : blocks_) {
    for (Page* p : cache_block.pages) {
      if (p != nullptr) out.push_back(p);
    }
  }
  for (const std::vector<Page*>* held : {&ssm_state_, &ssm_snapshot_}) {
    for (Page* p : *held) {
      if (p != nullptr) out.push_back(p);
    }
  }
  out.insert(out.end(), tree_holds_.begin(), tree_holds_.end());
  for (const auto& pages : scratch_pages_) out.insert(out.end(), pages.begin(), pages.end());
  return out;
}

bool KVCache::resume() {
  const auto lock = context_.lock();
  require(CacheStatus::kSuspended, "resume");
  Storage& storage = context_.storage();
  const double limit = context_.max_util_for_resume();
  for (const PoolGroup& pg : storage.pool_groups()) {
    if (pg.utilization() > limit) return false;
  }
  const auto [needs, priorities] = resume_needs();
  const std::vector<Page*> locking = to_lock();
  std::vector<Page*> below;
  for (Page* p : locking) {
    if (p->level != kGpuLevel) below.push_back(p);
  }
  if (!make_room(kGpuLevel, below, needs, locking)) return false;
  storage.move_up(below, kGpuLevel);
  std::vector<Page*> fresh;
  new_pages(needs, priorities, fresh);
  try {
    for (std::size_t i = 0; i < needs.size(); ++i) {
      Page* source = needs[i].first < 0 ? nullptr : source_of(needs[i].first, needs[i].second);
      if (source != nullptr) storage.copy(source, fresh[i]);  // copy-on-write of a reused partial block or snapshot
    }
  } catch (...) {
    for (Page* page : fresh) storage.unhold(page);  // the cache stays suspended, as it was
    throw;
  }
  place_resumed(needs, fresh);
  status_ = CacheStatus::kActive;
  return true;
}

std::pair<std::vector<KVCache::Need>, std::vector<int>> KVCache::resume_needs() {
  // Copies of reused partial blocks, missing blocks, new SSM states, then scratch slots.
  std::vector<Need> needs;
  for (std::int64_t ordinal = 0; ordinal < num_blocks(); ++ordinal) {
    if (!blocks_[ordinal].copy_on_resume) continue;
    for (int group = 0; group < static_cast<int>(num_layer_groups_); ++group) {
      if (blocks_[ordinal].pages[group] != nullptr) needs.emplace_back(ordinal, group);
    }
  }
  const auto more = missing(0, num_blocks(), capacity_, history_);
  needs.insert(needs.end(), more.begin(), more.end());
  // A new SSM state is filed under the block of the next token (for its priority).
  for (int group : ssm_layer_groups_) {
    if (ssm_state_[group] == nullptr) needs.emplace_back(history_ / tokens_per_block_, group);
  }
  std::vector<int> priorities;
  for (const auto& [ordinal, group] : needs) priorities.push_back(priority_of(ordinal, group));
  // Scratch slots last, with the default priority: never committed, they are never evicted.
  const std::vector<Need> scratch = scratch_needs(capacity_, history_);
  needs.insert(needs.end(), scratch.begin(), scratch.end());
  priorities.insert(priorities.end(), scratch.size(), kDefaultPriority);
  return {needs, priorities};
}

void KVCache::place_resumed(const std::vector<Need>& needs, const std::vector<Page*>& fresh) {
  // A resume's new pages in place, then every page the active cache uses locked.
  Storage& storage = context_.storage();
  for (std::size_t i = 0; i < needs.size(); ++i) {
    const auto [ordinal, group] = needs[i];
    if (ordinal < 0) {
      scratch_pages_[group].push_back(fresh[i]);
      storage.lock(fresh[i]);
      continue;
    }
    Page* source = source_of(ordinal, group);
    if (source != nullptr) storage.unhold(source);
    if (!context_.registry().kind(group).has_block_pages()) {
      ssm_state_[group] = fresh[i];
      ssm_snapshot_[group] = nullptr;
    } else {
      blocks_[ordinal].pages[group] = fresh[i];
    }
  }
  for (CacheBlock& cache_block : blocks_) cache_block.copy_on_resume = false;
  const std::vector<Range> stale = stale_ranges(history_);
  for (std::int64_t ordinal = 0; ordinal < num_blocks(); ++ordinal) {
    for (int group = 0; group < static_cast<int>(num_layer_groups_); ++group) {
      if (blocks_[ordinal].pages[group] != nullptr && !in_range(stale[group], ordinal)) lock_page(ordinal, group);
    }
  }
  for (int group : ssm_layer_groups_) {
    storage.lock(ssm_state_[group]);
    ssm_locked_[group] = true;
  }
}

Page* KVCache::source_of(std::int64_t ordinal, int layer_group) const {
  return context_.registry().kind(layer_group).has_block_pages() ? blocks_[ordinal].pages[layer_group]
                                                                 : ssm_snapshot_[layer_group];
}

bool KVCache::prefetch(int target_level) {
  const auto lock = context_.lock();
  require(CacheStatus::kSuspended, "prefetch");
  Storage& storage = context_.storage();
  const std::vector<Page*> locking = to_lock();
  std::vector<Page*> below;
  for (Page* p : locking) {
    if (p->level > target_level) below.push_back(p);
  }
  if (!make_room(target_level, below, {}, locking)) return false;
  storage.move_up(below, target_level);
  return true;
}

void KVCache::suspend() {
  const auto lock = context_.lock();
  require(CacheStatus::kActive, "suspend");
  suspend_locked();
}

void KVCache::close() {
  const auto lock = context_.lock();
  if (status_ == CacheStatus::kClosed) return;
  close_locked();
  if (context_.remote != nullptr) {  // a request's blocks are in the store once it closes
    context_.remote->flush();
    context_.remote->hand();
  }
}

void KVCache::close_dropped() {
  const auto lock = context_.lock();
  close_locked();
}

void KVCache::close_locked() {
  if (status_ == CacheStatus::kClosed) return;
  stop_committing_locked();
  // A long request's early pages and blocks were last touched at its prefill: the loops below
  // ask for those of the block some ordinals ahead.
  for (std::int64_t ordinal = num_blocks() - 1; ordinal >= 0; --ordinal) {
    if (ordinal >= kPrefetchBlocks) {
      for (const Page* page : blocks_[ordinal - kPrefetchBlocks].pages) {
        if (page != nullptr) prefetch_lines(page, sizeof(Page));
      }
    }
    for (int group = 0; group < static_cast<int>(num_layer_groups_); ++group) release_page(ordinal, group);
  }
  unlock_states();
  for (int group : block_layer_groups_) free_scratch(group, 0);
  for (int group : ssm_layer_groups_) {
    for (std::vector<Page*>* held : {&ssm_state_, &ssm_snapshot_}) {
      Page* page = (*held)[group];
      if (page != nullptr) {
        (*held)[group] = nullptr;
        context_.storage().unhold(page);
      }
    }
  }
  for (auto it = tree_holds_.rbegin(); it != tree_holds_.rend(); ++it) context_.storage().unhold(*it);
  tree_holds_.clear();
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {  // blocks left without pages go now
    if (blocks_.rend() - it > kPrefetchBlocks) {
      if (const Block* ahead = (it + kPrefetchBlocks)->tree_block) prefetch_lines(ahead, sizeof(Block));
    }
    if (it->tree_block != nullptr) {
      --it->tree_block->pins;
      context_.tree().prune(it->tree_block);
      it->tree_block = nullptr;
    }
  }
  status_ = CacheStatus::kClosed;
  context_.unregister_cache(this);
  // mark_stats_excluded: an excluded cache feeds the auto-tuner nothing.
  if (!stats.excluded) context_.rebalancer.sample(num_reused_, capacity_, history_);
}

}  // namespace kvcore
