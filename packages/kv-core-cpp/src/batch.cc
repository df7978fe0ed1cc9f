#include "kvcore/batch.h"

#include <utility>

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

std::optional<BatchFailure> commit_many(const std::vector<KVCache*>& caches, const Tokens& tokens,
                                        const std::vector<std::size_t>& counts, bool is_end) {
  std::size_t begin = 0;
  return in_order(caches.size(), [&](std::size_t i) {
    caches[i]->require(CacheStatus::kActive, "commit");
    caches[i]->require_commit_allowed();
    caches[i]->commit(TokenList::from(tokens, begin, begin + counts[i]), is_end);
    begin += counts[i];
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
