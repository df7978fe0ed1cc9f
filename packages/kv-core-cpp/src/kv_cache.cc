#include "kvcore/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/poison.h"
#include "kvcore/prefetch.h"

namespace kvcore {

namespace {

// How many blocks ahead close() asks for a block's pages and tree block.
constexpr std::int64_t kPrefetchBlocks = 8;

// Room for `n` items, grown geometrically: decode steps add a block at a time, and an exact
// reserve would move the whole table each time (an admission reserves exactly what it reuses).
template <typename V>
void reserve_for(V& v, std::size_t n) {
  if (v.capacity() >= n) return;
  try {
    v.reserve(std::max(n, 2 * v.capacity()));
  } catch (const std::exception&) {  // the doubled size may not fit where `n` does
    v.reserve(n);
  }
}

const char* status_name(CacheStatus s) {
  switch (s) {
    case CacheStatus::kActive:
      return "ACTIVE";
    case CacheStatus::kSuspended:
      return "SUSPENDED";
    case CacheStatus::kClosed:
      return "CLOSED";
  }
  return "";
}

}  // namespace

KVCache::KVCache(CacheContext& context, std::int64_t id, const ReuseScope& scope, const Digest& root_key,
                 TokenList tokens, const MatchPath& path, PriorityCallback priority, RequestStats request_stats)
    : stats(std::move(request_stats)),
      context_(context),
      id_(id),
      scope_(scope),
      root_key_(root_key),
      priority_(std::move(priority)),
      tokens_(std::move(tokens)),
      history_(static_cast<std::int64_t>(tokens_.size())),
      capacity_(history_),
      tpb_(context.tokens_per_block()),
      num_lcs_(context.registry().size()),
      block_lcs_(context.registry().block_life_cycles()),
      full_attention_only_(std::none_of(context.registry().life_cycles().begin(),
                                        context.registry().life_cycles().end(),
                                        [](const LifeCycle& lc) { return lc.window || lc.ssm; })),
      ssm_lcs_(context.registry().ssm_life_cycles()),
      num_reused_(history_),
      index_(num_lcs_),
      stale_scan_(num_lcs_, 0),
      cached_by_level_(static_cast<std::size_t>(context.storage().num_levels()), 0),
      ssm_state_(num_lcs_, nullptr),
      ssm_locked_(num_lcs_, false),
      ssm_snapshot_(num_lcs_, nullptr),
      scratch_on_(context.swa_scratch_reuse().has_value()),
      scratch_pages_(num_lcs_) {
  // Priorities first: a failing callback must leave the tree untouched.
  struct Reused {
    std::int64_t ordinal;
    int lc;
    Page* page;
    int priority;
  };
  std::vector<Reused> reused;
  reused.reserve(path.size() * block_lcs_.size());
  const std::vector<std::pair<std::int64_t, std::int64_t>> stale = stale_ranges(history_);
  for (std::size_t o = 0; o < path.size(); ++o) {
    Block* block = path[o].first;
    for (int lc : block_lcs_) {
      Page* page = block->pages[lc];
      const auto ordinal = static_cast<std::int64_t>(o);
      if (page != nullptr && !in_range(stale[lc], ordinal))
        reused.push_back({ordinal, lc, page, priority_of(ordinal, lc)});
    }
  }
  std::vector<Reused> snapshots;
  for (int lc : ssm_lcs_) {
    const auto last = static_cast<std::int64_t>(path.size()) - 1;
    Page* page = path.empty() ? nullptr : path.back().first->pages[lc];
    if (page != nullptr) snapshots.push_back({last, lc, page, priority_of(last, lc)});
  }
  std::vector<int> block_level(path.size(), 0);  // the coldest level among a block's reused pages
  for (const Reused& r : reused) block_level[r.ordinal] = std::max(block_level[r.ordinal], r.page->level);
  for (const Reused& r : snapshots) block_level[r.ordinal] = std::max(block_level[r.ordinal], r.page->level);
  for (std::size_t o = 0; o < path.size(); ++o) cached_by_level_[block_level[o]] += path[o].second;
  blocks_.reserve(path.size());
  for (const auto& [block, matched] : path) {
    CacheBlock& cb = blocks_.emplace_back(num_lcs_);
    if (matched == static_cast<std::int64_t>(block->tokens.size()) && matched == tpb_) {
      cb.tree_block = block;
      ++block->pins;
    } else {
      cb.copy_on_resume = true;  // a reused partial block: never written in place
    }
  }
  for (auto& idx : index_) idx.assign(path.size(), kBadPageIndex);
  Storage& storage = context_.storage();
  for (const Reused& r : reused) {
    storage.hold(r.page, r.priority);  // reuse may raise a block's priority
    blocks_[r.ordinal].pages[r.lc] = r.page;
  }
  for (const Reused& r : snapshots) {
    storage.hold(r.page, r.priority);
    ssm_snapshot_[r.lc] = r.page;
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

void KVCache::require(CacheStatus status, const char* api) const {
  if (status_ != status) {
    throw Error(ErrorKind::kInvalidState, std::string(api) + "() requires a " + status_name(status) +
                                              " cache (status: " + status_name(status_) + ")");
  }
}

void KVCache::require_commit_allowed() const {
  if (commit_state_ == CommitState::kUserStop)
    throw Error(ErrorKind::kLogic, "Cannot commit tokens after stop_committing()");
}

int KVCache::priority_of(std::int64_t ordinal, int lc) {
  if (!priority_) return kDefaultPriority;
  const int value = priority_(ordinal, lc);  // the binding checks the type
  if (value < kMinPriority || value > kMaxPriority) {
    throw Error(ErrorKind::kValue, "custom_priority_callback: " + std::to_string(value) + " is outside [" +
                                       std::to_string(kMinPriority) + ", " + std::to_string(kMaxPriority) + "]");
  }
  return value;
}

int KVCache::num_layer_groups() const { return static_cast<int>(num_lcs_); }

void KVCache::set_index(std::int64_t ordinal, int lc, std::int32_t value) {
  index_[lc][ordinal] = value;
  const auto it = user_buffers_.find(lc);
  if (it != user_buffers_.end()) it->second.data[ordinal] = value;
}

void KVCache::lock_page(std::int64_t ordinal, int lc) {
  Page* page = blocks_[ordinal].pages[lc];
  context_.storage().lock(page);
  blocks_[ordinal].locked[lc] = true;
  set_index(ordinal, lc, static_cast<std::int32_t>(page->slot));
}

void KVCache::unlock_page(std::int64_t ordinal, int lc) {
  CacheBlock& cb = blocks_[ordinal];
  if (!cb.locked[lc]) return;
  context_.storage().unlock(cb.pages[lc]);
  cb.locked[lc] = false;
  set_index(ordinal, lc, kBadPageIndex);
}

void KVCache::release_page(std::int64_t ordinal, int lc) {
  Page* page = blocks_[ordinal].pages[lc];
  if (page == nullptr) return;
  unlock_page(ordinal, lc);
  blocks_[ordinal].pages[lc] = nullptr;
  context_.storage().unhold(page);
}

bool KVCache::is_stale(int lc, std::int64_t ordinal, std::int64_t history) const {
  return context_.registry().is_stale(lc, ordinal, history);
}

std::vector<std::pair<std::int64_t, std::int64_t>> KVCache::stale_ranges(std::int64_t history) const {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  out.reserve(num_lcs_);
  for (int lc = 0; lc < static_cast<int>(num_lcs_); ++lc) out.push_back(context_.registry().stale_range(lc, history));
  return out;
}

std::vector<KVCache::Release> KVCache::stale_releases(std::int64_t history) const {
  // Pages of blocks stale at `history`; an uncommitted page is kept (held, unlocked) while it
  // may still be committed. With commit_min_snapshot a page out of the window is not kept for a
  // commit: the tree only gets the state reusable at the committed length.
  const bool allowed = commit_state_ == CommitState::kAllowed && !context_.commit_min_snapshot();
  std::vector<Release> out;
  for (int lc : block_lcs_) {
    const auto [begin, end] = context_.registry().stale_range(lc, history);
    for (std::int64_t o = std::max(begin, stale_scan_[lc]); o < std::min<std::int64_t>(end, num_blocks()); ++o) {
      const CacheBlock& cb = blocks_[o];
      const Page* page = cb.pages[lc];
      if (page == nullptr) continue;
      // A block already in the tree never takes our page (commit_block may keep it private), nor
      // does any block once committing stopped: such a page goes.
      const bool keep = allowed && !page->committed() && cb.tree_block == nullptr;
      if (keep && !cb.locked[lc]) continue;  // already kept for commit
      out.push_back({o, lc, keep});
    }
  }
  return out;
}

void KVCache::apply_stale_releases(const std::vector<Release>& releases, std::int64_t history) {
  for (const Release& r : releases) {
    if (r.keep) {
      unlock_page(r.ordinal, r.lc);
    } else {
      release_page(r.ordinal, r.lc);
    }
  }
  for (int lc : block_lcs_) {
    const auto [begin, end] = context_.registry().stale_range(lc, history);
    std::int64_t o = std::max(begin, stale_scan_[lc]);
    while (o < std::min<std::int64_t>(end, num_blocks()) && blocks_[o].pages[lc] == nullptr) ++o;
    stale_scan_[lc] = o;
  }
}

bool KVCache::fits(const std::vector<std::pair<std::int64_t, int>>& needs, const std::vector<Release>& releases,
                   const std::vector<Page*>& scratch_freed) {
  // Whether room can be made for `needs` once `releases` are applied in order: pages they free,
  // and pages they make evictable (queued first); `scratch_freed` (private scratch pages) are freed too.
  Storage& storage = context_.storage();
  const std::size_t num_groups = storage.pool_groups().size();
  std::vector<std::uint64_t> need(num_groups, 0);
  for (const auto& n : needs) ++need[storage.config().pool_group_of(n.second)];
  std::vector<std::uint64_t> freed(num_groups, 0);
  for (const Page* page : scratch_freed) ++freed[page->pool_group];
  std::vector<Page*> pending;
  for (const Release& r : releases) {
    const CacheBlock& cb = blocks_[r.ordinal];
    Page* page = cb.pages[r.lc];
    if (page == nullptr) continue;
    const int locks = page->locks - (cb.locked[r.lc] ? 1 : 0);
    const int holders = page->holders - (r.keep ? 0 : 1);
    if (holders == 0 && !page->committed()) {
      ++freed[page->pool_group];
    } else if (!page->queued && !locks && (holders == 0 ? page->committed() : page->level < storage.last_level())) {
      pending.push_back(page);
    }
  }
  return storage.can_make_room(kGpuLevel, need, pending, freed);
}

std::vector<Page*> KVCache::new_pages(const std::vector<std::pair<std::int64_t, int>>& needs,
                                      const std::vector<int>& priorities) {
  if (needs.empty()) return {};  // most resizes of a decode step: no allocation, no statistics to add
  std::vector<std::pair<int, int>> requests;
  for (std::size_t i = 0; i < needs.size(); ++i) requests.emplace_back(needs[i].second, priorities[i]);
  std::vector<Page*> pages = context_.storage().new_pages(requests);
  stats.allocated(needs);
  for (Page* p : pages) p->holders = 1;
  return pages;
}

std::array<std::pair<std::int64_t, std::int64_t>, 3> KVCache::live_ranges(int lc, std::int64_t first,
                                                                          std::int64_t num_blocks,
                                                                          std::int64_t capacity,
                                                                          std::int64_t history) const {
  // A window's stale range spans most of a long history: skipped, not scanned. The scratch
  // range lies above it.
  const auto [begin, end] = context_.registry().stale_range(lc, history);
  auto [a, b] = scratch_range(lc, capacity, history);
  if (a == b) a = b = end;
  return {{{first, std::min(begin, num_blocks)},
           {std::max(end, first), std::min(a, num_blocks)},
           {std::max({b, end, first}), num_blocks}}};
}

std::pair<std::int64_t, std::int64_t> KVCache::scratch_range(int lc, std::int64_t capacity,
                                                             std::int64_t history) const {
  const ScratchRule* rule = context_.scratch(lc);
  if (rule == nullptr || !scratch_on_) return {0, 0};
  return rule->range(context_.registry(), capacity, history);
}

std::int64_t KVCache::scratch_need(int lc, std::int64_t capacity, std::int64_t history) const {
  const ScratchRule* rule = context_.scratch(lc);
  const auto [a, b] = scratch_range(lc, capacity, history);
  return rule == nullptr || a == b ? 0 : rule->slots(b - a);
}

void KVCache::check_scratch_history(const char* api, std::int64_t capacity, std::int64_t history) const {
  // Scratch blocks leaving the scratch range must be stale at the new history: their data was
  // never kept, so no page could take them back.
  if (!scratch_on_) return;
  const std::int64_t num_blocks = ceil_div(capacity, tpb_);
  for (int lc : block_lcs_) {
    const auto [a, b] = scratch_range(lc, capacity_, history_);
    if (a == b) continue;
    const auto [a2, b2] = scratch_range(lc, capacity, history);
    std::vector<std::pair<std::int64_t, std::int64_t>> leaving;
    if (a2 < b2) {
      leaving = {{a, std::min(b, a2)}, {std::max(a, b2), b}};
    } else {
      leaving = {{a, b}};
    }
    const auto [begin, end] = context_.registry().stale_range(lc, history);
    for (auto [lo, hi] : leaving) {
      hi = std::min(hi, num_blocks);
      if (lo < hi && (lo < begin || hi > end)) {
        throw Error(ErrorKind::kValue, std::string(api) + ": history_length " + std::to_string(history) +
                                           " would bring back scratch blocks of layer group " + std::to_string(lc) +
                                           " (their data is gone); keep it at least capacity - max_rewind_len");
      }
    }
  }
}

void KVCache::free_scratch(int lc, std::size_t keep) {
  std::vector<Page*>& pages = scratch_pages_[lc];
  while (pages.size() > keep) {
    Page* page = pages.back();
    pages.pop_back();
    context_.storage().unlock(page);
    context_.storage().unhold(page);
  }
}

void KVCache::set_enable_swa_scratch_reuse(bool value) {
  const auto lock = context_.lock();
  if (value == scratch_on_) return;
  if (value && !context_.swa_scratch_reuse()) {
    throw Error(ErrorKind::kValue, "enable_swa_scratch_reuse: the manager's config has no swa_scratch_reuse");
  }
  // Either way the blocks of the scratch range would change hands (pages <-> scratch).
  for (int lc : block_lcs_) {
    const ScratchRule* rule = context_.scratch(lc);
    if (rule == nullptr) continue;
    const auto [a, b] = rule->range(context_.registry(), capacity_, history_);
    if (a < b) {
      throw Error(ErrorKind::kValue,
                  "enable_swa_scratch_reuse: cannot change while scratch blocks are needed (layer group " +
                      std::to_string(lc) + ")");
    }
  }
  scratch_on_ = value;
}

bool KVCache::has_scratch_slots() const {
  for (const auto& pages : scratch_pages_) {
    if (!pages.empty()) return true;
  }
  return false;
}

std::optional<std::pair<std::pair<std::int64_t, std::int64_t>, std::vector<std::int32_t>>> KVCache::get_scratch_desc(
    int layer_group) const {
  const std::vector<Page*>& pages = scratch_pages_[layer_group];
  if (pages.empty()) return std::nullopt;
  std::vector<std::int32_t> slots;
  for (const Page* p : pages) slots.push_back(static_cast<std::int32_t>(p->slot));
  return std::pair{scratch_range(layer_group, capacity_, history_), slots};
}

void KVCache::require_capacity_settable() const {
  // Alone, a new capacity keeps the history, which the scratch rule rarely allows.
  if (scratch_on_) {
    throw Error(ErrorKind::kValue, "capacity: cannot be set alone with SWA scratch reuse enabled (use resize)");
  }
}

std::vector<std::pair<std::int64_t, int>> KVCache::missing(std::int64_t first, std::int64_t num_blocks,
                                                           std::int64_t capacity, std::int64_t history) const {
  // Non-stale blocks in [first, num_blocks) without a page, by ordinal then life cycle. (Every
  // non-stale block of an open cache has its pages, so a resize only looks at those it adds.)
  std::vector<std::pair<std::int64_t, int>> out;
  for (int lc : block_lcs_) {
    for (const auto& [lo, hi] : live_ranges(lc, first, num_blocks, capacity, history)) {
      for (std::int64_t o = lo; o < hi; ++o) {
        if (o >= this->num_blocks() || blocks_[o].pages[lc] == nullptr) out.emplace_back(o, lc);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool KVCache::may_fit(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity, std::int64_t history) const {
  // Counted, not listed: a request beyond a pool group's slots is refused in constant time.
  Storage& storage = context_.storage();
  std::vector<std::uint64_t> per_pg(storage.pool_groups().size(), 0);
  for (int lc : block_lcs_) {
    for (const auto& [lo, hi] : live_ranges(lc, first, num_blocks, capacity, history)) {
      if (hi > lo) per_pg[storage.config().pool_group_of(lc)] += static_cast<std::uint64_t>(hi - lo);
    }
    const std::int64_t extra =
        scratch_need(lc, capacity, history) - static_cast<std::int64_t>(scratch_pages_[lc].size());
    if (extra > 0) per_pg[storage.config().pool_group_of(lc)] += static_cast<std::uint64_t>(extra);
  }
  for (const PoolGroup& pg : storage.pool_groups()) {
    if (per_pg[pg.index] > pg.allocator.num_slots()) return false;
  }
  return true;
}

std::vector<Page*> KVCache::held_pages() const {
  std::vector<Page*> out;
  for (const CacheBlock& cb : blocks_) {
    for (Page* p : cb.pages) {
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

std::vector<Page*> KVCache::to_lock() const {
  // The pages resume() locks: held, not stale, not a reused partial block's (copied), and the
  // SSM states.
  std::vector<Page*> out;
  out.reserve(blocks_.size() * num_lcs_ + ssm_state_.size());
  const std::vector<std::pair<std::int64_t, std::int64_t>> stale = stale_ranges(history_);
  for (std::int64_t o = 0; o < num_blocks(); ++o) {
    const CacheBlock& cb = blocks_[o];
    if (cb.copy_on_resume) continue;
    for (int lc = 0; lc < static_cast<int>(num_lcs_); ++lc) {
      if (cb.pages[lc] != nullptr && !in_range(stale[lc], o)) out.push_back(cb.pages[lc]);
    }
  }
  for (Page* p : ssm_state_) {
    if (p != nullptr) out.push_back(p);
  }
  return out;
}

Page* KVCache::source_of(std::int64_t ordinal, int lc) const {
  return context_.registry().is_ssm(lc) ? ssm_snapshot_[lc] : blocks_[ordinal].pages[lc];
}

bool KVCache::make_room(int level, const std::vector<Page*>& pages,
                        const std::vector<std::pair<std::int64_t, int>>& needs, const std::vector<Page*>& keep) {
  // Room at `level` for `pages` (ours, to move there) and `needs` (new pages), never evicting
  // `keep`. False, nothing changed, if short.
  Storage& storage = context_.storage();
  std::vector<std::uint64_t> need(storage.pool_groups().size(), 0);
  for (const Page* page : pages) ++need[page->pool_group];
  for (const auto& n : needs) ++need[storage.config().pool_group_of(n.second)];
  // Nothing to make room for (a cached prompt resuming on the device): no set of the pages to
  // keep, which would cost an allocation per page.
  if (std::all_of(need.begin(), need.end(), [](std::uint64_t n) { return n == 0; })) return true;
  Storage::PageSet exclude;
  for (const Page* page : keep) exclude.insert(page);
  try {
    storage.make_room(level, need, exclude);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kOutOfPages) return false;
    throw;
  }
  return true;
}

bool KVCache::resume() {
  const auto lock = context_.lock();
  require(CacheStatus::kSuspended, "resume");
  Storage& storage = context_.storage();
  const double limit = context_.max_util_for_resume();
  for (const PoolGroup& pg : storage.pool_groups()) {
    if (pg.utilization() > limit) return false;
  }
  std::vector<std::pair<std::int64_t, int>> needs;
  for (std::int64_t o = 0; o < num_blocks(); ++o) {
    if (!blocks_[o].copy_on_resume) continue;
    for (int lc = 0; lc < static_cast<int>(num_lcs_); ++lc) {
      if (blocks_[o].pages[lc] != nullptr) needs.emplace_back(o, lc);
    }
  }
  const auto more = missing(0, num_blocks(), capacity_, history_);
  needs.insert(needs.end(), more.begin(), more.end());
  // A new SSM state is filed under the block of the next token (for its priority).
  for (int lc : ssm_lcs_) {
    if (ssm_state_[lc] == nullptr) needs.emplace_back(history_ / tpb_, lc);
  }
  std::vector<int> priorities;
  for (const auto& [o, lc] : needs) priorities.push_back(priority_of(o, lc));
  // Scratch slots last (ordinal -1: they belong to no block), with the default priority: never
  // committed, they are never evicted.
  for (int lc : block_lcs_) {
    for (std::int64_t i = scratch_need(lc, capacity_, history_); i > 0; --i) {
      needs.emplace_back(-1, lc);
      priorities.push_back(kDefaultPriority);
    }
  }
  const std::vector<Page*> locking = to_lock();
  std::vector<Page*> below;
  for (Page* p : locking) {
    if (p->level != kGpuLevel) below.push_back(p);
  }
  if (!make_room(kGpuLevel, below, needs, locking)) return false;
  storage.move_up(below, kGpuLevel);
  const std::vector<Page*> fresh = new_pages(needs, priorities);
  try {
    for (std::size_t i = 0; i < needs.size(); ++i) {
      Page* source = needs[i].first < 0 ? nullptr : source_of(needs[i].first, needs[i].second);
      if (source != nullptr) storage.copy(source, fresh[i]);  // copy-on-write of a reused partial block or snapshot
    }
  } catch (...) {
    for (Page* page : fresh) storage.unhold(page);  // the cache stays suspended, as it was
    throw;
  }
  for (std::size_t i = 0; i < needs.size(); ++i) {
    const auto [o, lc] = needs[i];
    if (o < 0) {
      scratch_pages_[lc].push_back(fresh[i]);
      storage.lock(fresh[i]);
      continue;
    }
    Page* source = source_of(o, lc);
    if (source != nullptr) storage.unhold(source);
    if (context_.registry().is_ssm(lc)) {
      ssm_state_[lc] = fresh[i];
      ssm_snapshot_[lc] = nullptr;
    } else {
      blocks_[o].pages[lc] = fresh[i];
    }
  }
  for (CacheBlock& cb : blocks_) cb.copy_on_resume = false;
  const std::vector<std::pair<std::int64_t, std::int64_t>> stale = stale_ranges(history_);
  for (std::int64_t o = 0; o < num_blocks(); ++o) {
    for (int lc = 0; lc < static_cast<int>(num_lcs_); ++lc) {
      if (blocks_[o].pages[lc] != nullptr && !in_range(stale[lc], o)) lock_page(o, lc);
    }
  }
  for (int lc : ssm_lcs_) {
    storage.lock(ssm_state_[lc]);
    ssm_locked_[lc] = true;
  }
  status_ = CacheStatus::kActive;
  return true;
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

void KVCache::suspend_locked() {
  for (std::int64_t o = 0; o < num_blocks(); ++o) {
    for (int lc = 0; lc < static_cast<int>(num_lcs_); ++lc) unlock_page(o, lc);
  }
  unlock_states();
  for (int lc : block_lcs_) free_scratch(lc, 0);
  status_ = CacheStatus::kSuspended;
}

void KVCache::unlock_states() {
  for (int lc : ssm_lcs_) {
    if (ssm_locked_[lc] && ssm_state_[lc] != nullptr) {
      context_.storage().unlock(ssm_state_[lc]);
      ssm_locked_[lc] = false;
    }
  }
}

bool KVCache::resize(std::optional<std::int64_t> capacity, std::optional<std::int64_t> history_length) {
  const auto lock = context_.lock();
  require(CacheStatus::kActive, "resize");
  const std::int64_t cap = capacity.value_or(capacity_);
  const std::int64_t hist = history_length.value_or(history_);
  for (const auto& [name, v] : {std::pair{"capacity", cap}, std::pair{"history_length", hist}}) {
    if (v < 0 || v >= kTokenLimit) {  // the binding checks first; C++ callers meet this
      throw Error(ErrorKind::kValue, std::string(name) + ": must be in [0, " + std::to_string(kTokenLimit) + ") (got " +
                                         std::to_string(v) + ")");
    }
  }
  if (hist < history_) {
    throw Error(ErrorKind::kValue,
                "history_length: cannot decrease (" + std::to_string(history_) + " -> " + std::to_string(hist) + ")");
  }
  if (cap < hist) {
    throw Error(ErrorKind::kValue,
                "capacity: " + std::to_string(cap) + " is below history_length " + std::to_string(hist));
  }
  if (scratch_on_ && cap != capacity_) {
    // Blocks that were scratch must be stale at the new history (their data is gone), and no
    // token may be skipped.
    const std::int64_t low = std::max<std::int64_t>(0, capacity_ - context_.swa_scratch_reuse()->max_rewind_len);
    if (hist < low || hist > capacity_) {
      throw Error(ErrorKind::kValue, "resize: with SWA scratch reuse, a new capacity needs history_length in [" +
                                         std::to_string(low) + ", " + std::to_string(capacity_) + "] (got " +
                                         std::to_string(hist) + ")");
    }
  }
  check_scratch_history("resize", cap, hist);
  const std::int64_t new_blocks = ceil_div(cap, tpb_);
  for (const auto& [lc, buf] : user_buffers_) {
    if (static_cast<std::int64_t>(buf.size) < new_blocks) {
      throw Error(ErrorKind::kValue, "base page index buffer of layer group " + std::to_string(lc) + " too short: " +
                                         std::to_string(buf.size) + " < " + std::to_string(new_blocks));
    }
  }
  if (full_attention_only_ && new_blocks == num_blocks()) {
    // A decode step's usual resize. What the general path below finds here: no block to add or
    // shrink away, nothing stale, no scratch, so nothing to allocate, release or free.
    capacity_ = cap;
    history_ = hist;
    sync_user_buffers();
    return true;
  }
  if (!may_fit(num_blocks(), new_blocks, cap, hist)) return false;
  const std::vector<Release> releases = stale_releases(hist);
  std::vector<std::pair<std::int64_t, int>> shrink;
  for (std::int64_t o = new_blocks; o < num_blocks(); ++o) {
    for (int lc = 0; lc < static_cast<int>(num_lcs_); ++lc) shrink.emplace_back(o, lc);
  }
  auto needs = missing(num_blocks(), new_blocks, cap, hist);
  std::vector<int> priorities;
  for (const auto& [o, lc] : needs) priorities.push_back(priority_of(o, lc));
  // Scratch: pages of blocks entering the scratch range go (they hold tokens this step
  // rewrites); slots are added or freed to the new count.
  std::vector<Release> scratch_drops;
  std::vector<Page*> scratch_freed;
  for (int lc : block_lcs_) {
    const auto [a, b] = scratch_range(lc, cap, hist);
    for (std::int64_t o = a; o < std::min(b, num_blocks()); ++o) {
      if (blocks_[o].pages[lc] != nullptr) scratch_drops.push_back({o, lc, false});
    }
    const auto want = static_cast<std::size_t>(scratch_need(lc, cap, hist));
    const std::vector<Page*>& held = scratch_pages_[lc];
    for (std::size_t i = held.size(); i < want; ++i) {
      needs.emplace_back(-1, lc);
      priorities.push_back(kDefaultPriority);
    }
    for (std::size_t i = want; i < held.size(); ++i) scratch_freed.push_back(held[i]);
  }
  std::vector<Release> applied;
  for (auto it = shrink.rbegin(); it != shrink.rend(); ++it) applied.push_back({it->first, it->second, false});
  for (const Release& r : releases) {
    if (r.ordinal < new_blocks) applied.push_back(r);
  }
  applied.insert(applied.end(), scratch_drops.begin(), scratch_drops.end());
  if (!needs.empty() && applied.empty() && scratch_freed.empty()) {
    // Room made before anything changes: a failing copy leaves the cache as it was.
    if (!make_room(kGpuLevel, {}, needs)) return false;
  } else if (!needs.empty() && !fits(needs, applied, scratch_freed)) {
    return false;
  }
  try {  // room for the block table before anything changes: one the host cannot hold changes nothing
    reserve_for(blocks_, static_cast<std::size_t>(new_blocks));
    for (auto& idx : index_) reserve_for(idx, static_cast<std::size_t>(new_blocks));
  } catch (const std::exception&) {  // std::bad_alloc, or std::length_error beyond max_size()
    throw Error(ErrorKind::kHostOOM,
                "resize: cannot allocate " + std::to_string(new_blocks - num_blocks()) + " blocks");
  }
  for (auto it = shrink.rbegin(); it != shrink.rend(); ++it) release_page(it->first, it->second);
  std::vector<Release> kept;
  for (const Release& r : releases) {
    if (r.ordinal < new_blocks) kept.push_back(r);
  }
  apply_stale_releases(kept, hist);
  for (const Release& r : scratch_drops) release_page(r.ordinal, r.lc);
  for (int lc : block_lcs_) free_scratch(lc, static_cast<std::size_t>(scratch_need(lc, cap, hist)));
  blocks_.resize(static_cast<std::size_t>(std::min(new_blocks, num_blocks())), CacheBlock(num_lcs_));
  for (auto& idx : index_) idx.resize(blocks_.size());
  while (num_blocks() < new_blocks) {
    blocks_.emplace_back(num_lcs_);
    for (auto& idx : index_) idx.push_back(kBadPageIndex);
  }
  capacity_ = cap;
  history_ = hist;
  std::vector<Page*> pages;
  try {
    pages = new_pages(needs, priorities);
  } catch (...) {
    // Making room after this call's releases failed (a copy): the new lengths stay and the
    // cache is suspended; resume() allocates the missing pages.
    suspend_locked();
    sync_user_buffers();
    throw;
  }
  for (std::size_t i = 0; i < needs.size(); ++i) {
    if (needs[i].first < 0) {
      scratch_pages_[needs[i].second].push_back(pages[i]);
      context_.storage().lock(pages[i]);
      continue;
    }
    blocks_[needs[i].first].pages[needs[i].second] = pages[i];
    lock_page(needs[i].first, needs[i].second);
  }
  sync_user_buffers();
  return true;
}

void KVCache::commit(const TokenList& tokens, bool is_end, const std::uint8_t* keys) {
  commit(tokens.view(), 0, tokens.size(), is_end, keys);
}

void KVCache::commit(const Tokens& src, std::size_t begin, std::size_t end, bool is_end, const std::uint8_t* keys) {
  const auto lock = context_.lock();
  require(CacheStatus::kActive, "commit");
  require_commit_allowed();
  if (stats.text_only()) {
    for (const DigestToken& d : src.digests) {
      if (d.position >= begin && d.position < end) throw_text_only("tokens", d.position - begin);
    }
  }
  const auto committed = static_cast<std::int64_t>(tokens_.size());
  const auto added = static_cast<std::int64_t>(end - begin);
  if (committed + added > capacity_) {
    throw Error(ErrorKind::kValue, "commit: " + std::to_string(committed) + " committed + " + std::to_string(added) +
                                       " new tokens exceed capacity " + std::to_string(capacity_));
  }
  const bool cms = context_.commit_min_snapshot();
  if (cms && history_ != committed && history_ != committed + added) {
    throw Error(ErrorKind::kLogic, "commit: with commit_min_snapshot, history_length (" + std::to_string(history_) +
                                       ") must equal the committed tokens before (" + std::to_string(committed) +
                                       ") or after (" + std::to_string(committed + added) + ") the commit");
  }
  check_scratch_history("commit", capacity_, std::max(history_, committed + added));
  const std::int64_t first = committed / tpb_;
  tokens_.append(src, begin, end);
  history_ = std::max(history_, static_cast<std::int64_t>(tokens_.size()));
  const std::int64_t last = static_cast<std::int64_t>(tokens_.size()) / tpb_;
  // A decode step's usual commit: what the rest finds here is no scratch, nothing stale, no
  // block filled, no snapshot.
  if (full_attention_only_ && !cms && last == first && !is_end) return;
  // A longer history leaves fewer scratch blocks.
  for (int lc : block_lcs_) free_scratch(lc, static_cast<std::size_t>(scratch_need(lc, capacity_, history_)));
  // With commit_min_snapshot, pages out of the window go before their blocks could enter the tree.
  if (cms) apply_stale_releases(stale_releases(history_), history_);
  // The new full blocks' keys in one chain call (a prefill's hundreds of blocks) unless the
  // caller hashed them: each block committed is the next one's parent, under that key.
  std::vector<std::uint8_t> own;
  if (keys == nullptr && last > first) {
    if (const auto parent = commit_keys_parent_at(first)) {
      own.resize(32 * static_cast<std::size_t>(last - first + 1));
      chained_keys(*parent, tokens_.view(), static_cast<std::size_t>(first), static_cast<std::size_t>(last - first),
                   static_cast<std::size_t>(tpb_), context_.key_format(), own.data());
      keys = own.data() + 32;
    }
  }
  for (std::int64_t o = first; o < last; ++o) {
    commit_block(o, nullptr, keys == nullptr ? nullptr : keys + 32 * static_cast<std::size_t>(o - first));
  }
  if (cms && added > 0 && !is_end) snapshot(false);
  apply_stale_releases(stale_releases(history_), history_);
  if (is_end) stop_committing_locked(cms);
}

std::optional<Digest> KVCache::commit_keys_parent_at(std::int64_t ordinal) const {
  // parent_node's key, without creating the scope's root (block 0 chains from the root key).
  if (commit_state_ == CommitState::kVirtualStop) return std::nullopt;
  if (ordinal == 0) return root_key_;
  const Block* parent = blocks_[static_cast<std::size_t>(ordinal - 1)].tree_block;
  if (parent == nullptr) return std::nullopt;
  return parent->key;
}

KeyFormat KVCache::key_format() const { return context_.key_format(); }

std::optional<Digest> KVCache::commit_keys_parent() const {
  return commit_keys_parent_at(num_committed_tokens() / tpb_);
}

Node* KVCache::parent_node(std::int64_t ordinal) {
  if (ordinal == 0) return context_.tree().root(root_key_, scope_);
  return blocks_[ordinal - 1].tree_block;
}

void KVCache::commit_block(std::int64_t ordinal, const std::vector<Page*>* pages, const std::uint8_t* key_bytes) {
  // Put block `ordinal` (full, or the partial tail on stop) into the tree. A block already
  // there keeps the pages covering it and ours are given up for them (rebase); ours fill the
  // life cycles it lacks or covers only in part. A partial block a sibling extends is not added
  // (ours stay private); a new block replaces the partial sibling it extends and adopts its
  // pages. Without a parent in the tree the cache stops committing.
  if (commit_state_ == CommitState::kVirtualStop) return;
  Node* parent = parent_node(ordinal);
  if (parent == nullptr) {
    commit_state_ = CommitState::kVirtualStop;
    return;
  }
  CacheBlock& cb = blocks_[ordinal];
  const std::size_t begin = static_cast<std::size_t>(ordinal * tpb_);
  const std::size_t end = std::min(begin + static_cast<std::size_t>(tpb_), tokens_.size());
  Digest key;
  if (key_bytes != nullptr) {
    std::memcpy(key.data(), key_bytes, key.size());
  } else {
    std::uint8_t keys[64];  // the parent's key, then this block's
    chained_keys(parent->key, tokens_.view(), static_cast<std::size_t>(ordinal), 1, static_cast<std::size_t>(tpb_),
                 context_.key_format(), keys);
    std::memcpy(key.data(), keys + 32, key.size());
  }
  const auto num_tokens = static_cast<std::int64_t>(end - begin);
  const bool full = num_tokens == tpb_;
  Storage& storage = context_.storage();
  Block* block = parent->child(key);
  if (block == nullptr) {
    Block* shorter = nullptr;
    if (!parent->children().empty()) {  // siblings to compare with (the next block of a new chain has none)
      const TokenList tokens = tokens_.slice(begin, end);
      if (!full && RadixTree::covering_sibling(parent, tokens) != nullptr) return;
      shorter = RadixTree::covered_sibling(parent, tokens);
    }
    block = context_.tree().add(parent, key, tokens_, begin, end, ordinal);
    stats.committed_block();
    if (shorter != nullptr) storage.adopt(block, shorter);
  }
  Page* const* ours_by_lc = pages == nullptr ? cb.pages.data() : pages->data();
  for (int lc = 0; lc < static_cast<int>(num_lcs_); ++lc) {
    Page* ours = ours_by_lc[lc];
    Page* theirs = block->pages[lc];
    if (theirs != nullptr && theirs->num_tokens >= num_tokens) {
      if (ours != nullptr && ours != theirs && full && cb.locked[lc] && theirs->level != kGpuLevel) {
        if (theirs->holders) {
          // Another cache holds the tree's page and pins the block on it: the page stays the
          // block's, and we hold it too, so it outlives our pin as well; ours stays private.
          storage.hold(theirs);
          tree_holds_.push_back(theirs);
        } else {
          // The tree's copy sits on a colder level and ours, locked, is on the device: ours takes
          // its place (we hold it, so nothing drops the block).
          storage.replace(block, lc, ours);
        }
      } else if (ours != nullptr && ours != theirs && full) {
        storage.hold(theirs);
        if (cb.locked[lc]) {
          unlock_page(ordinal, lc);
          cb.pages[lc] = theirs;
          lock_page(ordinal, lc);
        } else {
          cb.pages[lc] = theirs;
        }
        storage.unhold(ours);
      }
    } else if (ours != nullptr && !ours->committed()) {
      attach(block, lc, ours, num_tokens);
    }
  }
  if (cb.tree_block == nullptr && full) {
    // Later blocks hang under a full block, so it stays in the tree while we are open (we hold
    // all its pages). A partial tail is the last block: nothing hangs under it, and when it
    // already existed we keep our private page and hold none of its pages.
    cb.tree_block = block;
    ++block->pins;
  } else {
    context_.tree().prune(block);  // a new partial block none of our pages went into
  }
}

void KVCache::attach(Block* block, int lc, Page* page, std::int64_t num_tokens) {
  // A page the block had covers fewer tokens (an adopted one covering a prefix): orphaned.
  if (block->pages[lc] != nullptr) context_.storage().orphan(block->pages[lc]);
  page->block = block;
  page->num_tokens = num_tokens;
  block->pages[lc] = page;
  stats.attached(lc);
  if (KVCacheEventManager* events = context_.events()) events->stored(block, lc, page->priority, page->level);
}

void KVCache::snapshot(bool move) {
  // What a request reusing exactly the committed tokens needs: a partial tail's attention pages
  // and the SSM states, each valid for the committed tokens of its block. Copies are made only
  // if room can be (no snapshot else: it is a cache, not state).
  const auto n = static_cast<std::int64_t>(tokens_.size());
  if (n == 0 || commit_state_ == CommitState::kVirtualStop) return;
  std::vector<std::pair<int, Page*>> states;
  for (int lc : ssm_lcs_) {
    if (ssm_state_[lc] != nullptr && !ssm_state_[lc]->committed()) states.emplace_back(lc, ssm_state_[lc]);
  }
  const bool tail = n % tpb_ != 0;
  Block* block = tail ? nullptr : blocks_[n / tpb_ - 1].tree_block;
  std::vector<std::pair<int, Page*>> sources;
  if (tail) {
    const CacheBlock& cb = blocks_[n / tpb_];
    if (cb.copy_on_resume) return;  // a reused partial block not copied yet: nothing of ours
    for (int lc : block_lcs_) {
      if (cb.pages[lc] != nullptr && !cb.pages[lc]->committed()) sources.emplace_back(lc, cb.pages[lc]);
    }
    sources.insert(sources.end(), states.begin(), states.end());
  } else if (block == nullptr) {
    return;
  } else {  // the full block is in the tree already: only states it lacks
    for (const auto& [lc, p] : states) {
      if (block->pages[lc] == nullptr || block->pages[lc]->num_tokens < tpb_) sources.emplace_back(lc, p);
    }
  }
  if (sources.empty()) return;
  std::vector<Page*> pages;
  for (const auto& source : sources) pages.push_back(source.second);
  if (!move) {
    pages = copies(pages);
    if (pages.empty()) {
      std::vector<int> lcs;
      for (const auto& source : sources) lcs.push_back(source.first);
      stats.snapshot_skipped(lcs);
      return;
    }
  }
  if (block == nullptr) {
    std::vector<Page*> override(num_lcs_, nullptr);
    for (std::size_t i = 0; i < sources.size(); ++i) override[sources[i].first] = pages[i];
    commit_block(n / tpb_, &override);
  } else {
    for (std::size_t i = 0; i < sources.size(); ++i) attach(block, sources[i].first, pages[i], tpb_);
  }
  if (!move) {
    for (Page* page : pages) context_.storage().unhold(page);  // the tree keeps those that went in
  }
}

std::vector<Page*> KVCache::copies(const std::vector<Page*>& sources) {
  Storage& storage = context_.storage();
  std::vector<std::pair<int, int>> requests;
  for (const Page* p : sources) requests.emplace_back(p->life_cycle, p->priority);
  std::vector<Page*> pages;
  try {
    pages = storage.new_pages(requests);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kOutOfPages) return {};
    throw;
  }
  for (Page* p : pages) p->holders = 1;
  try {
    for (std::size_t i = 0; i < sources.size(); ++i) storage.copy(sources[i], pages[i]);
  } catch (...) {
    for (Page* p : pages) storage.unhold(p);
    throw;
  }
  return pages;
}

void KVCache::stop_committing() {
  const auto lock = context_.lock();
  stop_committing_locked();
}

void KVCache::stop_committing_locked(bool move_state) {
  // `move_state` (commit_min_snapshot, is_end): the live tail pages and SSM states go into the
  // tree, not copies of them.
  if (commit_state_ == CommitState::kUserStop || status_ == CacheStatus::kClosed) return;
  const auto n = static_cast<std::int64_t>(tokens_.size());
  const std::int64_t ordinal = n / tpb_;
  if (move_state) {
    snapshot(true);
  } else if (n % tpb_ && ordinal < num_blocks() && !blocks_[ordinal].copy_on_resume) {
    commit_block(ordinal);
  }
  commit_state_ = CommitState::kUserStop;
  apply_stale_releases(stale_releases(history_), history_);
}

std::unique_ptr<PlannedDropHandle> KVCache::plan_committed_block_drop() {
  const auto lock = context_.lock();
  if (commit_state_ != CommitState::kUserStop) {
    throw Error(ErrorKind::kLogic, "plan_committed_block_drop() requires stop_committing()");
  }
  return plan_drop(context_, root_key_, tokens_);
}

void KVCache::close() {
  const auto lock = context_.lock();
  close_locked();
}

void KVCache::close_locked() {
  if (status_ == CacheStatus::kClosed) return;
  stop_committing_locked();
  // A long request's early pages and blocks were last touched at its prefill: the loops below
  // ask for those of the block some ordinals ahead.
  for (std::int64_t o = num_blocks() - 1; o >= 0; --o) {
    if (o >= kPrefetchBlocks) {
      for (const Page* page : blocks_[o - kPrefetchBlocks].pages) {
        if (page != nullptr) prefetch_lines(page, sizeof(Page));
      }
    }
    for (int lc = 0; lc < static_cast<int>(num_lcs_); ++lc) release_page(o, lc);
  }
  unlock_states();
  for (int lc : block_lcs_) free_scratch(lc, 0);
  for (int lc : ssm_lcs_) {
    for (std::vector<Page*>* held : {&ssm_state_, &ssm_snapshot_}) {
      Page* page = (*held)[lc];
      if (page != nullptr) {
        (*held)[lc] = nullptr;
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

std::vector<std::int32_t> KVCache::get_base_page_indices(int layer_group) const {
  const auto lock = context_.lock();
  return index_[layer_group];
}

std::int32_t KVCache::get_ssm_block_base_index(int layer_group) const {
  const auto lock = context_.lock();
  const Page* state = ssm_state_[layer_group];
  return state != nullptr && ssm_locked_[layer_group] ? static_cast<std::int32_t>(state->slot) : kBadPageIndex;
}

std::vector<std::int32_t> KVCache::get_page_levels(int layer_group) const {
  const auto lock = context_.lock();
  std::vector<std::int32_t> out;
  out.reserve(blocks_.size());
  for (const CacheBlock& cb : blocks_) {
    const Page* page = cb.pages[layer_group];
    out.push_back(page ? page->level : -1);
  }
  return out;
}

void KVCache::set_base_page_index_buf(int layer_group, IndexBuffer buffer) {
  const auto lock = context_.lock();  // resize and close write through the buffers it changes
  if (buffer.data == nullptr) {
    user_buffers_.erase(layer_group);
    return;
  }
  if (static_cast<std::int64_t>(buffer.size) < num_blocks()) {
    throw Error(ErrorKind::kValue,
                "buf: too short (" + std::to_string(buffer.size) + " < " + std::to_string(num_blocks()) + " blocks)");
  }
  user_buffers_[layer_group] = buffer;
  sync_user_buffers();
}

void KVCache::sync_user_buffers() {
  for (auto& [lc, buf] : user_buffers_) {
    const std::vector<std::int32_t>& idx = index_[lc];
    std::copy(idx.begin(), idx.end(), buf.data);
    std::fill(buf.data + idx.size(), buf.data + buf.size, kBadPageIndex);
  }
}

}  // namespace kvcore
