// The page steps every part of a cache takes (cache_state.py): lock, unlock, release, priority.
#include <string>

#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/kv_cache.h"

namespace kvcore {

namespace {

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

int KVCache::num_layer_groups() const { return static_cast<int>(num_layer_groups_); }

int KVCache::priority_of(std::int64_t ordinal, int layer_group) {
  if (!priority_) return kDefaultPriority;
  const int value = priority_(ordinal, layer_group);  // the binding checks the type
  if (value < kMinPriority || value > kMaxPriority) {
    throw Error(ErrorKind::kValue, "custom_priority_callback: " + std::to_string(value) + " is outside [" +
                                       std::to_string(kMinPriority) + ", " + std::to_string(kMaxPriority) + "]");
  }
  return value;
}

void KVCache::set_index(std::int64_t ordinal, int layer_group, std::int32_t value) {
  index_[layer_group][ordinal] = value;
  const auto it = user_buffers_.find(layer_group);
  if (it != user_buffers_.end()) it->second.data[ordinal] = value;
}

void KVCache::lock_page(std::int64_t ordinal, int layer_group) {
  Page* page = blocks_[ordinal].pages[layer_group];
  context_.storage().lock(page);
  blocks_[ordinal].locked[layer_group] = true;
  set_index(ordinal, layer_group, static_cast<std::int32_t>(page->slot));
}

void KVCache::unlock_page(std::int64_t ordinal, int layer_group) {
  CacheBlock& cache_block = blocks_[ordinal];
  if (!cache_block.locked[layer_group]) return;
  context_.storage().unlock(cache_block.pages[layer_group]);
  cache_block.locked[layer_group] = false;
  set_index(ordinal, layer_group, kBadPageIndex);
}

void KVCache::release_page(std::int64_t ordinal, int layer_group) {
  Page* page = blocks_[ordinal].pages[layer_group];
  if (page == nullptr) return;
  unlock_page(ordinal, layer_group);
  blocks_[ordinal].pages[layer_group] = nullptr;
  context_.storage().unhold(page);
}

bool KVCache::is_stale(int layer_group, std::int64_t ordinal, std::int64_t history) const {
  return context_.registry().is_stale(layer_group, ordinal, history);
}

std::vector<KVCache::Range> KVCache::stale_ranges(std::int64_t history) const {
  std::vector<Range> out;
  out.reserve(num_layer_groups_);
  for (int group = 0; group < static_cast<int>(num_layer_groups_); ++group) {
    out.push_back(context_.registry().stale_range(group, history));
  }
  return out;
}

void KVCache::unlock_states() {
  for (int group : ssm_layer_groups_) {
    if (ssm_locked_[group] && ssm_state_[group] != nullptr) {
      context_.storage().unlock(ssm_state_[group]);
      ssm_locked_[group] = false;
    }
  }
}

}  // namespace kvcore
