#include "kvcore/batch.h"

#include <algorithm>
#include <utility>

#include "kvcore/block_keys.h"

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

// One cache's part of a commit_many: its tokens and, when hashed ahead, the keys of the blocks
// they fill (chained from commit_keys_parent over the partial block's committed tokens and these).
struct PreparedCommit {
  TokenList tokens;
  TokenList filled;  // the tokens of the blocks the commit fills
  Tokens view;       // of `filled`
  std::vector<std::uint8_t> keys;
};

// Hashes ahead the blocks each cache's commit fills, where that cannot differ from what the
// commit computes itself: the cache appears once in the batch (its committed tokens before its
// commit are those it has now), is active, may commit, and its tokens fit (else the commit fails
// before hashing). Two or more chains are needed for the interleaving to pay.
void hash_ahead(const std::vector<KVCache*>& caches, std::vector<PreparedCommit>& prepared, KeyFormat format) {
  std::vector<std::size_t> filling;  // the caches whose commit fills a block
  for (std::size_t i = 0; i < caches.size(); ++i) {
    const KVCache* c = caches[i];
    const auto tpb = static_cast<std::size_t>(c->tokens_per_block());
    const std::size_t committed = c->committed_tokens().size(), added = prepared[i].tokens.size();
    if ((committed + added) / tpb > committed / tpb) filling.push_back(i);
  }
  if (filling.size() < 2) return;  // one chain: the commit hashes it itself, as fast
  std::vector<KVCache*> sorted(caches);
  std::sort(sorted.begin(), sorted.end());
  std::vector<KeyChainRun> runs;
  std::size_t tpb = 0;
  for (const std::size_t i : filling) {
    KVCache* c = caches[i];
    const auto [lo, hi] = std::equal_range(sorted.begin(), sorted.end(), c);
    if (hi - lo != 1 || c->status() != CacheStatus::kActive || c->commit_state() != CommitState::kAllowed) continue;
    const std::size_t committed = c->committed_tokens().size();
    const std::size_t added = prepared[i].tokens.size();
    if (static_cast<std::int64_t>(committed + added) > c->capacity()) continue;
    const std::optional<Digest> parent = c->commit_keys_parent();
    if (!parent) continue;
    tpb = static_cast<std::size_t>(c->tokens_per_block());
    const std::size_t first = committed / tpb, last = (committed + added) / tpb;
    PreparedCommit& p = prepared[i];
    p.filled = c->committed_tokens().slice(first * tpb, committed);
    p.filled.append(p.tokens.slice(0, last * tpb - committed));
    p.view = p.filled.view();
    p.keys.resize(32 * (last - first + 1));
    runs.push_back({*parent, &p.view, 0, last - first, p.keys.data()});
  }
  if (runs.empty()) return;
  chained_keys_many(tpb, runs.data(), runs.size(), format);
}

}  // namespace

std::optional<BatchFailure> commit_many(const std::vector<KVCache*>& caches, const Tokens& tokens,
                                        const std::vector<std::size_t>& counts, bool is_end) {
  std::vector<PreparedCommit> prepared(caches.size());
  std::size_t begin = 0;
  for (std::size_t i = 0; i < caches.size(); ++i) {
    prepared[i].tokens = TokenList::from(tokens, begin, begin + counts[i]);
    begin += counts[i];
  }
  if (!caches.empty()) hash_ahead(caches, prepared, caches[0]->key_format());
  return in_order(caches.size(), [&](std::size_t i) {
    caches[i]->require(CacheStatus::kActive, "commit");
    caches[i]->require_commit_allowed();
    const PreparedCommit& p = prepared[i];
    caches[i]->commit(p.tokens, is_end, p.keys.empty() ? nullptr : p.keys.data() + 32);
  });
}

std::optional<BatchFailure> admit_many(KVCacheManager& manager, std::vector<Admission>& admissions,
                                       std::vector<std::unique_ptr<KVCache>>& created) {
  created.reserve(admissions.size());
  return in_order(admissions.size(), [&](std::size_t i) {
    Admission& a = admissions[i];
    created.push_back(manager.create_kv_cache(a.scope, *a.prompt, a.id, std::move(a.priority)));
  });
}

}  // namespace kvcore
