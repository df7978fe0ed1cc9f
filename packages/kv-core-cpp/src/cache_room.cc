// What a step of a cache needs and whether it fits (cache_room.py): the pages its blocks lack, the
// pages that go stale, and room on the device level, asked from cheapest to dearest:
// fits_pool_groups, can_make_room_after, make_room.
#include <algorithm>

#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/kv_cache.h"

namespace kvcore {

std::vector<KVCache::Release> KVCache::stale_releases(std::int64_t history) const {
  // Pages of blocks stale at `history`; an uncommitted page is kept (held, unlocked) while it
  // may still be committed. With commit_min_snapshot a page out of the window is not kept for a
  // commit: the tree only gets the state reusable at the committed length.
  const bool allowed = commit_state_ == CommitState::kAllowed && !context_.commit_min_snapshot();
  std::vector<Release> out;
  for (int group : block_layer_groups_) {
    const auto [begin, end] = context_.registry().stale_range(group, history);
    const std::int64_t stop = std::min<std::int64_t>(end, num_blocks());
    for (std::int64_t ordinal = std::max(begin, stale_scan_[group]); ordinal < stop; ++ordinal) {
      const CacheBlock& cache_block = blocks_[ordinal];
      const Page* page = cache_block.pages[group];
      if (page == nullptr) continue;
      // A block already in the tree never takes our page (commit_block may keep it private), nor
      // does any block once committing stopped: such a page goes.
      const bool keep = allowed && !page->committed() && cache_block.tree_block == nullptr;
      if (keep && !cache_block.locked[group]) continue;  // already kept for commit
      out.push_back({ordinal, group, keep});
    }
  }
  return out;
}

void KVCache::apply_stale_releases(const std::vector<Release>& releases, std::int64_t history) {
  for (const Release& r : releases) {
    if (r.keep) {
      unlock_page(r.ordinal, r.layer_group);
    } else {
      release_page(r.ordinal, r.layer_group);
    }
  }
  for (int group : block_layer_groups_) {
    const auto [begin, end] = context_.registry().stale_range(group, history);
    std::int64_t ordinal = std::max(begin, stale_scan_[group]);
    while (ordinal < std::min<std::int64_t>(end, num_blocks()) && blocks_[ordinal].pages[group] == nullptr) ++ordinal;
    stale_scan_[group] = ordinal;
  }
}

std::array<KVCache::Range, 3> KVCache::live_ranges(int layer_group, std::int64_t first, std::int64_t num_blocks,
                                                   std::int64_t capacity, std::int64_t history) const {
  // A window's stale range spans most of a long history: skipped, not scanned. The scratch
  // range lies above it.
  const auto [begin, end] = context_.registry().stale_range(layer_group, history);
  auto [a, b] = scratch_range(layer_group, capacity, history);
  if (a == b) a = b = end;
  return {{{first, std::min(begin, num_blocks)},
           {std::max(end, first), std::min(a, num_blocks)},
           {std::max({b, end, first}), num_blocks}}};
}

std::vector<KVCache::Need> KVCache::missing(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity,
                                            std::int64_t history) const {
  std::vector<Need> out;
  missing(first, num_blocks, capacity, history, out);
  return out;
}

void KVCache::missing(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity, std::int64_t history,
                      std::vector<Need>& out) const {
  // Non-stale blocks in [first, num_blocks) without a page, by ordinal then layer group. (Every
  // non-stale block of an open cache has its pages, so a resize only looks at those it adds.)
  out.clear();
  for (int group : block_layer_groups_) {
    for (const auto& [lo, hi] : live_ranges(group, first, num_blocks, capacity, history)) {
      for (std::int64_t ordinal = lo; ordinal < hi; ++ordinal) {
        if (ordinal >= this->num_blocks() || blocks_[ordinal].pages[group] == nullptr) out.emplace_back(ordinal, group);
      }
    }
  }
  // One layer group's list is in order already (a prefill's hundreds of blocks): checked, not sorted.
  if (!std::is_sorted(out.begin(), out.end())) std::sort(out.begin(), out.end());
}

std::vector<KVCache::Need> KVCache::scratch_needs(std::int64_t capacity, std::int64_t history) const {
  // The scratch slots the layer groups lack at these lengths (ordinal -1: no block).
  std::vector<Need> out;
  for (int group : block_layer_groups_) {
    const auto held = static_cast<std::int64_t>(scratch_pages_[group].size());
    for (std::int64_t i = held; i < scratch_need(group, capacity, history); ++i) out.emplace_back(-1, group);
  }
  return out;
}

bool KVCache::fits_pool_groups(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity,
                               std::int64_t history) const {
  // Counted, not listed: a request beyond a pool group's slots is refused in constant time.
  Storage& storage = context_.storage();
  Borrowed<std::uint64_t> counts(work_.per_pool_group);
  std::vector<std::uint64_t>& per_pool_group = *counts;
  per_pool_group.assign(storage.pool_groups().size(), 0);
  for (int group : block_layer_groups_) {
    std::uint64_t& count = per_pool_group[storage.config().pool_group_of(group)];
    for (const auto& [lo, hi] : live_ranges(group, first, num_blocks, capacity, history)) {
      if (hi > lo) count += static_cast<std::uint64_t>(hi - lo);
    }
    const std::int64_t extra =
        scratch_need(group, capacity, history) - static_cast<std::int64_t>(scratch_pages_[group].size());
    if (extra > 0) count += static_cast<std::uint64_t>(extra);
  }
  for (const PoolGroup& pg : storage.pool_groups()) {
    if (per_pool_group[pg.index] > pg.allocator.num_slots()) return false;
  }
  return true;
}

bool KVCache::can_make_room_after(const std::vector<Need>& needs, const std::vector<Release>& releases,
                                  const std::vector<Page*>& scratch_freed) {
  // Pages `releases` free, and pages they make evictable (queued first); `scratch_freed`
  // (private scratch pages) are freed too.
  Storage& storage = context_.storage();
  const std::size_t num_pool_groups = storage.pool_groups().size();
  std::vector<std::uint64_t> need(num_pool_groups, 0);
  for (const Need& n : needs) ++need[storage.config().pool_group_of(n.second)];
  std::vector<std::uint64_t> freed(num_pool_groups, 0);
  for (const Page* page : scratch_freed) ++freed[storage.pool_group(page)];
  std::vector<Page*> pending;
  for (const Release& r : releases) {
    const CacheBlock& cache_block = blocks_[r.ordinal];
    Page* page = cache_block.pages[r.layer_group];
    if (page == nullptr) continue;
    const int locks = page->locks - (cache_block.locked[r.layer_group] ? 1 : 0);
    const int holders = page->holders - (r.keep ? 0 : 1);
    if (holders == 0 && !page->committed()) {
      ++freed[storage.pool_group(page)];
    } else if (!page->queued && !locks && (holders == 0 ? page->committed() : page->level < storage.last_level())) {
      pending.push_back(page);
    }
  }
  return storage.can_make_room(kGpuLevel, need, pending, freed);
}

bool KVCache::make_room(int level, const std::vector<Page*>& pages, const std::vector<Need>& needs,
                        const std::vector<Page*>& keep) {
  Storage& storage = context_.storage();
  Borrowed<std::uint64_t> counts(work_.per_pool_group);
  std::vector<std::uint64_t>& need = *counts;
  need.assign(storage.pool_groups().size(), 0);
  for (const Page* page : pages) ++need[storage.pool_group(page)];
  for (const Need& n : needs) ++need[storage.config().pool_group_of(n.second)];
  // Nothing to make room for (a cached prompt resuming on the device): no list of the pages to
  // keep to sort.
  if (std::all_of(need.begin(), need.end(), [](std::uint64_t n) { return n == 0; })) return true;
  Borrowed<const Page*> kept_list(work_.kept);
  std::vector<const Page*>& kept = *kept_list;
  kept.assign(keep.begin(), keep.end());
  const PageSet exclude(kept);
  try {
    storage.make_room(level, need, exclude);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kOutOfPages) return false;
    throw;
  }
  return true;
}

void KVCache::new_pages(const std::vector<Need>& needs, const std::vector<int>& priorities, std::vector<Page*>& out) {
  out.clear();
  if (needs.empty()) return;  // most resizes of a decode step: no allocation, no statistics to add
  Borrowed<std::pair<int, int>> requests_list(work_.requests);
  std::vector<std::pair<int, int>>& requests = *requests_list;
  for (std::size_t i = 0; i < needs.size(); ++i) requests.emplace_back(needs[i].second, priorities[i]);
  context_.storage().new_pages(requests, out);
  stats.allocated(needs);
  for (Page* p : out) p->holders = 1;
}

std::vector<Page*> KVCache::to_lock() const {
  // The pages resume() locks: held, not stale, not a reused partial block's (copied), and the
  // SSM states.
  std::vector<Page*> out;
  out.reserve(blocks_.size() * num_layer_groups_ + ssm_state_.size());
  const std::vector<Range> stale = stale_ranges(history_);
  for (std::int64_t ordinal = 0; ordinal < num_blocks(); ++ordinal) {
    const CacheBlock& cache_block = blocks_[ordinal];
    if (cache_block.copy_on_resume) continue;
    for (int group = 0; group < static_cast<int>(num_layer_groups_); ++group) {
      if (cache_block.pages[group] != nullptr && !in_range(stale[group], ordinal))
        out.push_back(cache_block.pages[group]);
    }
  }
  for (Page* p : ssm_state_) {
    if (p != nullptr) out.push_back(p);
  }
  return out;
}

void KVCache::suspend_locked() {
  for (std::int64_t ordinal = 0; ordinal < num_blocks(); ++ordinal) {
    for (int group = 0; group < static_cast<int>(num_layer_groups_); ++group) unlock_page(ordinal, group);
  }
  unlock_states();
  for (int group : block_layer_groups_) free_scratch(group, 0);
  status_ = CacheStatus::kSuspended;
}

}  // namespace kvcore
