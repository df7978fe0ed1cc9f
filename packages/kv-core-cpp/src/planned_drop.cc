#include "kvcore/planned_drop.h"

#include <algorithm>

#include "kvcore/cache_context.h"
#include "kvcore/error.h"
#include "kvcore/poison.h"

namespace kvcore {

PlannedDropHandle::PlannedDropHandle(CacheContext& context, const std::vector<Page*>& pages) : context_(context) {
  pages_.reserve(pages.size());
  Storage& storage = context_.storage();
  try {
    for (Page* page : pages) {
      storage.plan_drop(page);
      pages_.emplace_back(page, page->generation);  // within the capacity: cannot throw
    }
  } catch (...) {
    for (const auto& planned : pages_) storage.unplan_drop(planned.first);
    throw;
  }
}

PlannedDropHandle::~PlannedDropHandle() {
  if (dropped_) return;
  // Poisoned, the pages' bookkeeping cannot be trusted: the plan is forgotten.
  const auto lock = context_.lock_unchecked();
  if (poison::reason()) return;
  try {
    apply();
  } catch (...) {  // never throw from a destructor
  }
}

void PlannedDropHandle::drop() {
  const auto lock = context_.lock();
  if (dropped_) throw Error(ErrorKind::kLogic, "Planned drop handle has already been dropped");
  apply();
}

void PlannedDropHandle::release() {
  const auto lock = context_.lock();
  if (!dropped_) apply();
}

void PlannedDropHandle::apply() {
  // A page dropped or freed meanwhile (its record retired) is skipped, as is every page of a
  // shut-down manager; one still held, or still planned by another handle, stays in the tree and
  // is evicted as any other page later.
  dropped_ = true;
  for (const auto& [page, generation] : pages_) {
    if (page->generation != generation) continue;
    if (context_.storage().unplan_drop(page) && page->committed() && page->holders == 0 && page->queued) {
      context_.storage().drop_now(page);
    }
  }
  pages_.clear();
}

std::unique_ptr<PlannedDropHandle> plan_drop(CacheContext& context, const Digest& root_key, const TokenList& tokens) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n == 0) return nullptr;
  const MatchPath path = context.rematch(root_key, tokens.view());
  std::int64_t matched = 0;
  for (const auto& step : path) matched += step.second;
  if (matched != n) return nullptr;
  const auto end = static_cast<std::int64_t>(path.size());
  std::vector<Page*> pages;
  for (const LifeCycle& life : context.registry().life_cycles()) {
    const std::optional<std::int64_t> first = context.registry().kind(life.id).planned_drop_first(n, end);
    if (!first) continue;
    for (std::int64_t ordinal = *first; ordinal < end; ++ordinal) {
      Page* page = path[static_cast<std::size_t>(ordinal)].first->pages[life.id];
      if (page == nullptr) return nullptr;  // the match validated these: defensive
      pages.push_back(page);
    }
  }
  return std::make_unique<PlannedDropHandle>(context, pages);
}

}  // namespace kvcore
