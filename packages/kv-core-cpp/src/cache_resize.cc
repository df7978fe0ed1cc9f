// Resizing an active cache (cache_resize.py): new capacity and history checked, the pages they
// release and need worked out before anything changes, then applied.
#include <algorithm>
#include <string>

#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/kv_cache.h"

namespace kvcore {

namespace {

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

}  // namespace

// What a resize changes, worked out before anything does.
void KVCache::require_capacity_settable() const {
  // Alone, a new capacity keeps the history, which the scratch rule rarely allows.
  if (scratch_on_) {
    throw Error(ErrorKind::kValue, "capacity: cannot be set alone with SWA scratch reuse enabled (use resize)");
  }
}

bool KVCache::resize(std::optional<std::int64_t> capacity, std::optional<std::int64_t> history_length) {
  const auto lock = context_.lock();
  require(CacheStatus::kActive, "resize");
  const auto [new_capacity, history] = checked_lengths(capacity, history_length);
  const std::int64_t num_blocks = ceil_div(new_capacity, tokens_per_block_);
  for (const auto& [group, buf] : user_buffers_) {
    if (static_cast<std::int64_t>(buf.size) < num_blocks) {
      throw Error(ErrorKind::kValue, "base page index buffer of layer group " + std::to_string(group) + " too short: " +
                                         std::to_string(buf.size) + " < " + std::to_string(num_blocks));
    }
  }
  if (full_attention_only_ && num_blocks == this->num_blocks()) {
    // A decode step's usual resize. What the general path below finds here: no block to add or
    // shrink away, nothing stale, no scratch, so nothing to allocate, release or free.
    capacity_ = new_capacity;
    history_ = history;
    sync_user_buffers();
    return true;
  }
  if (!fits_pool_groups(this->num_blocks(), num_blocks, new_capacity, history)) return false;
  Borrowed<ResizePlan> plans(work_.plan, true);
  if ((*plans).empty()) (*plans).emplace_back();
  ResizePlan& plan = (*plans)[0];
  resize_plan(num_blocks, new_capacity, history, plan);
  Borrowed<Release> applied_list(work_.applied);
  std::vector<Release>& applied = *applied_list;
  for (const auto& [ordinal, group] : plan.shrink) applied.push_back({ordinal, group, false});
  applied.insert(applied.end(), plan.releases.begin(), plan.releases.end());
  applied.insert(applied.end(), plan.scratch_drops.begin(), plan.scratch_drops.end());
  if (!plan.needs.empty() && applied.empty() && plan.scratch_freed.empty()) {
    // Room made before anything changes: a failing copy leaves the cache as it was.
    if (!make_room(kGpuLevel, {}, plan.needs)) return false;
  } else if (!plan.needs.empty() && !can_make_room_after(plan.needs, applied, plan.scratch_freed)) {
    return false;
  }
  try {  // room for the block table before anything changes: one the host cannot hold changes nothing
    reserve_for(blocks_, static_cast<std::size_t>(num_blocks));
    for (auto& index : index_) reserve_for(index, static_cast<std::size_t>(num_blocks));
  } catch (const std::exception&) {  // std::bad_alloc, or std::length_error beyond max_size()
    throw Error(ErrorKind::kHostOOM,
                "resize: cannot allocate " + std::to_string(num_blocks - this->num_blocks()) + " blocks");
  }
  apply_resize(plan, num_blocks, new_capacity, history);
  Borrowed<Page*> pages_list(work_.pages);
  std::vector<Page*>& pages = *pages_list;
  try {
    new_pages(plan.needs, plan.priorities, pages);
  } catch (...) {
    // Making room after this call's releases failed (a copy): the new lengths stay and the
    // cache is suspended; resume() allocates the missing pages.
    suspend_locked();
    sync_user_buffers();
    throw;
  }
  for (std::size_t i = 0; i < plan.needs.size(); ++i) {
    const auto [ordinal, group] = plan.needs[i];
    if (ordinal < 0) {
      scratch_pages_[group].push_back(pages[i]);
      context_.storage().lock(pages[i]);
      continue;
    }
    blocks_[ordinal].pages[group] = pages[i];
    lock_page(ordinal, group);
  }
  sync_user_buffers();
  return true;
}

std::pair<std::int64_t, std::int64_t> KVCache::checked_lengths(std::optional<std::int64_t> capacity,
                                                               std::optional<std::int64_t> history_length) const {
  const std::int64_t new_capacity = capacity.value_or(capacity_);
  const std::int64_t history = history_length.value_or(history_);
  for (const auto& [name, v] : {std::pair{"capacity", new_capacity}, std::pair{"history_length", history}}) {
    if (v < 0 || v >= kTokenLimit) {  // the binding checks first; C++ callers meet this
      throw Error(ErrorKind::kValue, std::string(name) + ": must be in [0, " + std::to_string(kTokenLimit) + ") (got " +
                                         std::to_string(v) + ")");
    }
  }
  if (history < history_) {
    throw Error(ErrorKind::kValue, "history_length: cannot decrease (" + std::to_string(history_) + " -> " +
                                       std::to_string(history) + ")");
  }
  if (new_capacity < history) {
    throw Error(ErrorKind::kValue,
                "capacity: " + std::to_string(new_capacity) + " is below history_length " + std::to_string(history));
  }
  if (scratch_on_ && new_capacity != capacity_) {
    // Blocks that were scratch must be stale at the new history (their data is gone), and no
    // token may be skipped.
    const std::int64_t low = std::max<std::int64_t>(0, capacity_ - context_.swa_scratch_reuse()->max_rewind_len);
    if (history < low || history > capacity_) {
      throw Error(ErrorKind::kValue, "resize: with SWA scratch reuse, a new capacity needs history_length in [" +
                                         std::to_string(low) + ", " + std::to_string(capacity_) + "] (got " +
                                         std::to_string(history) + ")");
    }
  }
  check_scratch_history("resize", new_capacity, history);
  return {new_capacity, history};
}

void KVCache::ResizePlan::clear() noexcept {
  shrink.clear();
  releases.clear();
  scratch_drops.clear();
  scratch_freed.clear();
  needs.clear();
  priorities.clear();
}

void KVCache::resize_plan(std::int64_t num_blocks, std::int64_t capacity, std::int64_t history, ResizePlan& plan) {
  plan.clear();
  for (std::int64_t ordinal = this->num_blocks() - 1; ordinal >= num_blocks; --ordinal) {
    for (int group = static_cast<int>(num_layer_groups_) - 1; group >= 0; --group)
      plan.shrink.emplace_back(ordinal, group);
  }
  for (const Release& r : stale_releases(history)) {
    if (r.ordinal < num_blocks) plan.releases.push_back(r);
  }
  missing(this->num_blocks(), num_blocks, capacity, history, plan.needs);
  for (const auto& [ordinal, group] : plan.needs) plan.priorities.push_back(priority_of(ordinal, group));
  // Scratch: pages of blocks entering the scratch range go (they hold tokens this step
  // rewrites); slots are added or freed to the new count.
  for (int group : block_layer_groups_) {
    const auto [a, b] = scratch_range(group, capacity, history);
    for (std::int64_t ordinal = a; ordinal < std::min(b, this->num_blocks()); ++ordinal) {
      if (blocks_[ordinal].pages[group] != nullptr) plan.scratch_drops.push_back({ordinal, group, false});
    }
    const std::vector<Page*>& held = scratch_pages_[group];
    const auto want = static_cast<std::size_t>(scratch_need(group, capacity, history));
    for (std::size_t i = held.size(); i < want; ++i) {  // after every block's need, as resume orders them
      plan.needs.emplace_back(-1, group);
      plan.priorities.push_back(kDefaultPriority);
    }
    for (std::size_t i = want; i < held.size(); ++i) plan.scratch_freed.push_back(held[i]);
  }
}

void KVCache::apply_resize(const ResizePlan& plan, std::int64_t num_blocks, std::int64_t capacity,
                           std::int64_t history) {
  // Gives up the pages `plan` releases and sets the new blocks and lengths.
  for (const auto& [ordinal, group] : plan.shrink) release_page(ordinal, group);
  apply_stale_releases(plan.releases, history);
  for (const Release& r : plan.scratch_drops) release_page(r.ordinal, r.layer_group);
  for (int group : block_layer_groups_)
    free_scratch(group, static_cast<std::size_t>(scratch_need(group, capacity, history)));
  blocks_.resize(static_cast<std::size_t>(std::min(num_blocks, this->num_blocks())), CacheBlock(num_layer_groups_));
  for (auto& index : index_) index.resize(blocks_.size());
  while (this->num_blocks() < num_blocks) {
    blocks_.emplace_back(num_layer_groups_);
    for (auto& index : index_) index.push_back(kBadPageIndex);
  }
  capacity_ = capacity;
  history_ = history;
}

}  // namespace kvcore
