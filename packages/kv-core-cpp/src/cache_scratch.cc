// A cache's sliding-window scratch (cache_scratch.py): where its scratch blocks lie at given
// lengths, the shared slots they take, and the switch. The rule itself is ScratchRule's.
#include <algorithm>
#include <string>

#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/kv_cache.h"

namespace kvcore {

KVCache::Range KVCache::scratch_range(int layer_group, std::int64_t capacity, std::int64_t history) const {
  const ScratchRule* rule = context_.scratch(layer_group);
  if (rule == nullptr || !scratch_on_) return {0, 0};
  return rule->range(context_.registry(), capacity, history);
}

std::int64_t KVCache::scratch_need(int layer_group, std::int64_t capacity, std::int64_t history) const {
  const ScratchRule* rule = context_.scratch(layer_group);
  const auto [a, b] = scratch_range(layer_group, capacity, history);
  return rule == nullptr || a == b ? 0 : rule->slots(b - a);
}

void KVCache::check_scratch_history(const char* api, std::int64_t capacity, std::int64_t history) const {
  // Scratch blocks leaving the scratch range must be stale at the new history: their data was
  // never kept, so no page could take them back.
  if (!scratch_on_) return;
  const std::int64_t num_blocks = ceil_div(capacity, tokens_per_block_);
  for (int group : block_layer_groups_) {
    const auto [a, b] = scratch_range(group, capacity_, history_);
    if (a == b) continue;
    const auto [a2, b2] = scratch_range(group, capacity, history);
    std::vector<Range> leaving;
    if (a2 < b2) {
      leaving = {{a, std::min(b, a2)}, {std::max(a, b2), b}};
    } else {
      leaving = {{a, b}};
    }
    const auto [begin, end] = context_.registry().stale_range(group, history);
    for (auto [lo, hi] : leaving) {
      hi = std::min(hi, num_blocks);
      if (lo < hi && (lo < begin || hi > end)) {
        throw Error(ErrorKind::kValue, std::string(api) + ": history_length " + std::to_string(history) +
                                           " would bring back scratch blocks of layer group " + std::to_string(group) +
                                           " (their data is gone); keep it at least capacity - max_rewind_len");
      }
    }
  }
}

void KVCache::free_scratch(int layer_group, std::size_t keep) {
  std::vector<Page*>& pages = scratch_pages_[layer_group];
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
  for (int group : block_layer_groups_) {
    const ScratchRule* rule = context_.scratch(group);
    if (rule == nullptr) continue;
    const auto [a, b] = rule->range(context_.registry(), capacity_, history_);
    if (a < b) {
      throw Error(ErrorKind::kValue,
                  "enable_swa_scratch_reuse: cannot change while scratch blocks are needed (layer group " +
                      std::to_string(group) + ")");
    }
  }
  scratch_on_ = value;
}

bool KVCache::has_scratch_slots() const {
  return std::any_of(scratch_pages_.begin(), scratch_pages_.end(),
                     [](const std::vector<Page*>& pages) { return !pages.empty(); });
}

std::optional<std::pair<KVCache::Range, std::vector<std::int32_t>>> KVCache::get_scratch_desc(int layer_group) const {
  const std::vector<Page*>& pages = scratch_pages_[layer_group];
  if (pages.empty()) return std::nullopt;
  std::vector<std::int32_t> slots;
  for (const Page* p : pages) slots.push_back(static_cast<std::int32_t>(p->slot));
  return std::pair{scratch_range(layer_group, capacity_, history_), slots};
}

}  // namespace kvcore
