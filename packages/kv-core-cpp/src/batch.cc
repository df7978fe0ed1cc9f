#include "kvcore/batch.h"

#include <algorithm>
#include <utility>

#include "kvcore/block_keys.h"
#include "kvcore/cache_context.h"
#include "kvcore/kv_cache.h"
#include "kvcore/remote_tier.h"
#include "kvcore/storage.h"

namespace kvcore {

namespace {

// Runs call(0), call(1), ... and stops at the first that throws.
template <typename Call>
std::optional<BatchFailure> in_order(std::size_t n, Call&& call) {
  for (std::size_t i = 0; i < n; ++i) {
    try {
      call(i);
    } catch (...) {
      return BatchFailure{i, std::current_exception()};
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<BatchFailure> resize_many(const std::vector<KVCache*>& caches,
                                        const std::vector<std::optional<std::int64_t>>& capacities,
                                        std::vector<bool>& results) {
  results.reserve(caches.size());
  return in_order(caches.size(), [&](std::size_t i) {
    // The state first, as the binding's single resize checks it before its arguments.
    caches[i]->require(CacheStatus::kActive, "resize");
    results.push_back(caches[i]->resize(capacities[i], std::nullopt));
  });
}

namespace {

// A commit of a batch whose full blocks are hashed ahead: the tokens of those blocks (the
// partial block's committed tokens, then the commit's) and their keys, chained from
// commit_keys_parent (the first entry).
struct HashedAhead {
  std::size_t index;  // in the batch
  TokenList filled;
  Tokens view;  // of `filled`
  std::vector<std::uint8_t> keys;
};

// Hashes ahead the blocks each cache's commit fills (tokens [starts[i], starts[i + 1]) of
// `tokens`), where that cannot differ from what the commit computes itself: the cache appears
// once in the batch (its committed tokens before its commit are those it has now), is active,
// may commit, and its tokens fit (else the commit fails before hashing). Two or more chains are
// needed for the interleaving to pay.
std::vector<HashedAhead> hash_ahead(const std::vector<KVCache*>& caches, const Tokens& tokens,
                                    const std::vector<std::size_t>& starts, KeyFormat format) {
  std::vector<HashedAhead> out;
  std::vector<std::size_t> filling;  // the caches whose commit fills a block
  for (std::size_t i = 0; i < caches.size(); ++i) {
    if (caches[i]->fills_block(starts[i + 1] - starts[i])) filling.push_back(i);
  }
  if (filling.size() < 2) return out;  // one chain: the commit hashes it itself, as fast
  std::vector<KVCache*> sorted(caches);
  std::sort(sorted.begin(), sorted.end());
  out.reserve(filling.size());  // the runs point into it
  std::vector<KeyChainRun> runs;
  std::size_t tokens_per_block = 0;
  for (const std::size_t i : filling) {
    KVCache* c = caches[i];
    const auto [lo, hi] = std::equal_range(sorted.begin(), sorted.end(), c);
    if (hi - lo != 1 || c->status() != CacheStatus::kActive || c->commit_state() != CommitState::kAllowed) continue;
    const std::size_t committed = c->committed_tokens().size();
    const std::size_t added = starts[i + 1] - starts[i];
    if (static_cast<std::int64_t>(committed + added) > c->capacity()) continue;
    const std::optional<Digest> parent = c->commit_keys_parent();
    if (!parent) continue;
    tokens_per_block = static_cast<std::size_t>(c->tokens_per_block());
    const std::size_t first = committed / tokens_per_block, last = (committed + added) / tokens_per_block;
    HashedAhead& h = out.emplace_back();
    h.index = i;
    h.filled = c->committed_tokens().slice(first * tokens_per_block, committed);
    h.filled.append(tokens, starts[i], starts[i] + (last * tokens_per_block - committed));
    h.view = h.filled.view();
    h.keys.resize(32 * (last - first + 1));
    runs.push_back({*parent, &h.view, 0, last - first, h.keys.data()});
  }
  if (!runs.empty()) chained_keys_many(tokens_per_block, runs.data(), runs.size(), format);
  return out;
}

}  // namespace

std::optional<BatchFailure> commit_many(const std::vector<KVCache*>& caches, const Tokens& tokens,
                                        const std::vector<std::size_t>& counts, bool is_end, std::size_t begin) {
  std::vector<std::size_t> starts(caches.size() + 1, begin);  // cache i commits tokens [starts[i], starts[i + 1])
  for (std::size_t i = 0; i < caches.size(); ++i) starts[i + 1] = starts[i] + counts[i];
  const std::vector<HashedAhead> ahead =
      caches.empty() ? std::vector<HashedAhead>{} : hash_ahead(caches, tokens, starts, caches[0]->key_format());
  std::size_t next = 0;  // the next entry of `ahead` (in batch order)
  // The blocks the batch's commits write through go to the store in one put, after the last.
  RemoteTier* remote = caches.empty() ? nullptr : caches[0]->context().remote;
  if (remote != nullptr) remote->begin_batch();
  const std::optional<BatchFailure> failure = in_order(caches.size(), [&](std::size_t i) {
    caches[i]->require(CacheStatus::kActive, "commit");
    caches[i]->require_commit_allowed();
    const std::uint8_t* keys = nullptr;
    if (next < ahead.size() && ahead[next].index == i) keys = ahead[next++].keys.data() + 32;
    caches[i]->commit(tokens, starts[i], starts[i + 1], is_end, keys);
  });
  if (remote != nullptr) remote->end_batch();
  return failure;
}

DecodeRun decode_steps(KVCacheManager& manager, const std::vector<KVCache*>& caches, const Tokens& tokens,
                       std::size_t steps, const std::vector<std::uint64_t>* until_room) {
  DecodeRun run;
  const std::size_t n = caches.size();
  const std::vector<std::size_t> ones(n, 1);
  std::vector<std::optional<std::int64_t>> capacities(n);
  std::vector<bool> resized;
  for (; run.steps < steps; ++run.steps) {
    for (std::size_t i = 0; i < n; ++i) {
      const auto next = static_cast<std::int64_t>(caches[i]->committed_tokens().size()) + 1;
      capacities[i] = std::max(caches[i]->capacity(), next);
    }
    resized.clear();
    run.failure = resize_many(caches, capacities, resized);
    if (run.failure) {
      run.results = std::move(resized);
      return run;
    }
    if (std::find(resized.begin(), resized.end(), false) != resized.end()) {
      run.resized = std::move(resized);
      return run;
    }
    run.failure = commit_many(caches, tokens, ones, false, run.steps * n);
    if (run.failure) {
      run.failed_committing = true;
      return run;
    }
    bool more_room = false;
    const std::vector<StorageStatistics> stats = manager.storage().statistics(0);
    for (std::size_t g = 0; g < stats.size(); ++g) {
      run.free.push_back(stats[g].free);
      run.evictable.push_back(stats[g].evictable);
      more_room = more_room || (until_room != nullptr && stats[g].free + stats[g].evictable > (*until_room)[g]);
    }
    if (more_room) {
      ++run.steps;  // this iteration ran
      return run;
    }
  }
  return run;
}

std::optional<BatchFailure> admit_many(KVCacheManager& manager, std::vector<Admission>& admissions,
                                       std::vector<std::unique_ptr<KVCache>>& created) {
  created.reserve(admissions.size());
  return in_order(admissions.size(), [&](std::size_t i) {
    Admission& a = admissions[i];
    created.push_back(manager.create_kv_cache(a.scope, *a.prompt, a.id, std::move(a.priority), std::nullopt,
                                              std::nullopt, false, a.max_reused_tokens));
  });
}

}  // namespace kvcore
