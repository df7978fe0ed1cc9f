// Planned drops (docs/manager.md, "Planned drops"; mirrors planned_drop.py): a finished request's
// tree pages that only its exact continuation would reuse (the trailing window pages, the last
// block's SSM snapshot), to be dropped once the caller knows no continuation comes. Each page
// counts the plans outstanding on it, so several plans on one page must all be dropped before it
// goes.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kvcore/block_keys.h"
#include "kvcore/page.h"
#include "kvcore/tokens.h"

namespace kvcore {

class CacheContext;

// Made under the manager's lock by plan_drop. It knows its pages by (record, generation) and owns
// none: a page freed meanwhile, its record reused, is skipped. The manager must outlive it (the
// binding keeps the Python manager alive). drop(), release() and the destructor take the
// manager's lock themselves (the thread rule: docs/architecture.md, Threads); dropped() reads the
// flag without it, for the handle's owner.
class PlannedDropHandle {
 public:
  // REQUIRES: the manager's lock (it counts itself on each page).
  PlannedDropHandle(CacheContext& context, const std::vector<Page*>& pages);
  // Applies the plan if not dropped yet; never throws (skipped when poisoned).
  ~PlannedDropHandle();
  PlannedDropHandle(const PlannedDropHandle&) = delete;
  PlannedDropHandle& operator=(const PlannedDropHandle&) = delete;

  // Withdraws the plan: a page no other plan covers that nobody holds is dropped now.
  // Error(kLogic) when dropped already.
  void drop();
  // drop() unless dropped already (a `with` block's end).
  void release();
  bool dropped() const { return dropped_; }

 private:
  void apply();  // REQUIRES: the manager's lock

  CacheContext& context_;
  std::vector<std::pair<Page*, std::uint64_t>> pages_;  // each page's record and its generation
  bool dropped_ = false;
};

// The plan for a cache's committed `tokens` (the cache stopped committing): nullptr when there are
// none or the re-match (without backoff) does not reuse them all. REQUIRES: the manager's lock.
std::unique_ptr<PlannedDropHandle> plan_drop(CacheContext& context, const Digest& root_key, const TokenList& tokens);

}  // namespace kvcore
