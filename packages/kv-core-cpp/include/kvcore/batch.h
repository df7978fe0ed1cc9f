// Batched calls (docs/manager.md, "Batched calls"; mirrors batch.py): many caches' resize, commit
// or admission in one call, exactly the single calls in order. The first call that throws ends the
// batch: the calls before it took effect, it and the later ones did not, and the caller learns its
// index.
//
// REQUIRES: the manager's lock, held by the caller for the whole batch (one consistent state, as
// a single call sees it; the binding takes it once, then releases the GIL). The caller has checked
// the arguments; the caches are that manager's, borrowed (admit_many hands the new ones to the
// caller). The thread rule: docs/architecture.md, Threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "kvcore/kv_cache.h"
#include "kvcore/manager.h"
#include "kvcore/tokens.h"

namespace kvcore {

// The call that threw and what it threw.
struct BatchFailure {
  std::size_t index;
  std::exception_ptr error;
};

// caches[i]->resize(capacities[i], nullopt) in order; `results` gets one entry per call made.
std::optional<BatchFailure> resize_many(const std::vector<KVCache*>& caches,
                                        const std::vector<std::optional<std::int64_t>>& capacities,
                                        std::vector<bool>& results);

// caches[i]->commit(its slice of `tokens`, is_end) in order, the slices consecutive from `begin`,
// counts[i] tokens each (the counts sum to tokens.count - begin or less). The blocks the commits
// fill are hashed first, two caches' chains at a time (chained_keys_many), for the caches that
// appear once in the batch.
std::optional<BatchFailure> commit_many(const std::vector<KVCache*>& caches, const Tokens& tokens,
                                        const std::vector<std::size_t>& counts, bool is_end, std::size_t begin = 0);

// Up to `steps` decode iterations (the contract's decode_steps): iteration k is resize_many to
// max(capacity, committed + 1) for every cache, then, if every resize succeeded, commit_many of
// tokens [k * n, (k + 1) * n), one each (n = caches.size(); `tokens` holds steps * n). With
// `until_room` (one per pool group), it stops after an iteration that leaves a pool group more
// free + evictable slots than that.
struct DecodeRun {
  std::size_t steps = 0;                 // iterations that ran in full
  std::vector<bool> resized;             // the stopped iteration's resize results (empty: none stopped)
  std::vector<std::uint64_t> free;       // after each iteration that ran, per pool group, in order
  std::vector<std::uint64_t> evictable;  // the same
  // The call that threw, in iteration `steps`: in its commit_many (else its resize_many), and the
  // results of that batched call's calls before it.
  std::optional<BatchFailure> failure;
  bool failed_committing = false;
  std::vector<bool> results;
};
DecodeRun decode_steps(KVCacheManager& manager, const std::vector<KVCache*>& caches, const Tokens& tokens,
                       std::size_t steps, const std::vector<std::uint64_t>* until_room = nullptr);

// One create_kv_cache per prompt, in order; `created` gets the caches of the calls made.
struct Admission {
  ReuseScope scope;
  const Tokens* prompt;
  std::optional<std::int64_t> id;
  PriorityCallback priority;
  std::optional<std::int64_t> max_reused_tokens;
};
std::optional<BatchFailure> admit_many(KVCacheManager& manager, std::vector<Admission>& admissions,
                                       std::vector<std::unique_ptr<KVCache>>& created);

}  // namespace kvcore
