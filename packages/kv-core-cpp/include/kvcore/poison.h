// The poison latch (docs/errors.md, "The poison latch"; mirrors poison.py): once an internal
// invariant is found violated, the core's state can no longer be trusted, so every later public
// call of a manager, its caches and event managers throws Error(kCorrupted) naming the first
// violation, until every manager is gone and take() clears it. Process-wide, one per backend
// module.
//
// Threads: every function is thread-safe and needs no manager's lock: a mutex guards the reason
// and the live-manager count, and an atomic flag mirrors the reason, so check() is one load while
// the core is clear. CacheContext::lock() calls check() before it takes the manager's lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kvcore/error.h"

namespace kvcore::poison {

// The environment variable that unlocks the debug hooks, read at each call.
inline constexpr const char* kDebugHooksEnv = "KV_DEBUG_HOOKS";

// Poison the core; the first reason wins (later ones are consequences of it).
void record(const std::string& reason);
// Record `reason` and return the error that reports it, for `throw poison::corrupted(...)`.
Error corrupted(const std::string& reason);
// Error(kCorrupted) naming the reason if the core is poisoned: the first thing every public call does.
void check();
// The recorded reason, if any; never clears it.
std::optional<std::string> reason();
// Clears the latch and returns its reason (nullopt when not poisoned). Only with no manager
// alive: a live one may hold the broken state, so Error(kLogic) says how many remain and the
// latch stays.
std::optional<std::string> take();
// Managers built and neither shut down nor destroyed.
std::int64_t num_live_managers();
// Poison the core as an internal invariant violation would (tests of the latch); Error(kRuntime)
// unless KV_DEBUG_HOOKS=1 is in the environment at the call, so no production path can.
void debug_poison(const std::string& reason);

// Counts its manager alive from construction (which checks the latch first) until release()
// (the manager's shutdown) or destruction, whichever comes first: counted down once. It is its
// manager's: release() runs in shutdown(), under the manager's lock, or in the destructor.
class LiveManager {
 public:
  LiveManager();
  ~LiveManager() { release(); }
  LiveManager(const LiveManager&) = delete;
  LiveManager& operator=(const LiveManager&) = delete;
  void release();

 private:
  bool live_ = true;
};

}  // namespace kvcore::poison
