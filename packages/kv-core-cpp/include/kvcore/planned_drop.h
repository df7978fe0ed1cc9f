// Planned drops (see planned_drop.py): a finished request's tree pages that only its exact
// continuation would reuse (the trailing window pages, the last block's SSM snapshot), to be
// dropped once the caller knows no continuation comes. Each page counts the plans outstanding on
// it, so several plans on one page must all be dropped before it goes.
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

// Made under the manager's lock by plan_drop. The manager must outlive it (the binding keeps the
// Python manager alive).
class PlannedDropHandle {
 public:
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
  void apply();  // under the lock

  CacheContext& context_;
  std::vector<std::pair<Page*, std::uint64_t>> pages_;  // each page's record and its generation
  bool dropped_ = false;
};

// The plan for a cache's committed `tokens` (under the lock, the cache stopped committing):
// nullptr when there are none or the re-match (without backoff) does not reuse them all.
std::unique_ptr<PlannedDropHandle> plan_drop(CacheContext& context, const Digest& root_key, const TokenList& tokens);

}  // namespace kvcore
