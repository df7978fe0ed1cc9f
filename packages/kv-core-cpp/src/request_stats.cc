#include "kvcore/request_stats.h"

#include "kvcore/error.h"

namespace kvcore {

StatsBook::StatsBook(CacheContext& context)
    : context(context), is_ssm(context.registry().size(), false), layer_group_stats(context.registry().size()) {
  for (int group : context.registry().ssm_layer_groups()) is_ssm[static_cast<std::size_t>(group)] = true;
}

std::map<int, LifeCycleStats> StatsBook::take_life_cycle_stats() {
  std::map<int, LifeCycleStats> out;
  for (std::size_t group = 0; group < layer_group_stats.size(); ++group)
    out[static_cast<int>(group)] = layer_group_stats[group];
  layer_group_stats.assign(layer_group_stats.size(), LifeCycleStats{});
  return out;
}

SsmSnapshotStats StatsBook::take_ssm_stats() {
  const SsmSnapshotStats out = ssm;
  ssm = SsmSnapshotStats{};
  return out;
}

std::optional<std::size_t> first_digest(const Tokens& tokens) {
  if (tokens.digests.empty()) return std::nullopt;
  return tokens.digests.front().position;
}

void throw_text_only(const char* where, std::size_t position) {
  throw Error(ErrorKind::kValue, std::string(where) + ": token " + std::to_string(position) +
                                     " is a multimodal digest, which a text_only KV cache refuses");
}

RequestStats::RequestStats(StatsBook& book, std::int64_t cache_id, bool enabled, std::int64_t expected_prompt_length,
                           bool text_only)
    : excluded(book.excluded.count(cache_id) != 0),
      book_(book),
      cache_id_(cache_id),
      enabled_(enabled),
      expected_prompt_length_(expected_prompt_length),
      text_only_(text_only),
      first_generation_block_((expected_prompt_length + book.context.tokens_per_block() - 1) /
                              book.context.tokens_per_block()) {}

void RequestStats::add_pending(const KVCacheStatsDelta& d) {
  pending_.lookup_tokens += d.lookup_tokens;
  pending_.reused_tokens += d.reused_tokens;
  pending_.allocated_pages += d.allocated_pages;
  pending_.generation_allocated_pages += d.generation_allocated_pages;
  pending_.committed_blocks += d.committed_blocks;
  if (d.lookup_tokens || d.reused_tokens || d.allocated_pages || d.generation_allocated_pages || d.committed_blocks) {
    book_.dirty.insert(cache_id_);
  }
}

void RequestStats::created(std::uint64_t lookup_tokens, std::uint64_t reused_tokens, bool reused_snapshot,
                           const Misses* misses) {
  if (!excluded) {
    CacheStats delta;
    delta.requests = 1;
    delta.lookup_tokens = lookup_tokens;
    delta.reused_tokens = reused_tokens;
    if (misses != nullptr) {
      delta.miss_stale_tokens = static_cast<std::uint64_t>(misses->stale);
      delta.miss_capped_tokens = static_cast<std::uint64_t>(misses->capped);
      delta.miss_evicted_tokens = static_cast<std::uint64_t>(misses->evicted);
      delta.miss_partial_tokens = static_cast<std::uint64_t>(misses->partial);
      delta.miss_never_seen_tokens = static_cast<std::uint64_t>(misses->never_seen);
      delta.miss_other_scope_tokens = static_cast<std::uint64_t>(misses->other_scope);
    }
    book_.context.add_stats(delta);
    book_.ssm.reused += reused_snapshot;
  }
  if (enabled_) {
    KVCacheStatsDelta d;
    d.lookup_tokens = lookup_tokens;
    d.reused_tokens = reused_tokens;
    add_pending(d);
  }
}

void RequestStats::allocated(const std::vector<std::pair<std::int64_t, int>>& needs) {
  if (!excluded) {
    book_.context.count(&CacheStats::allocated_pages, needs.size());
    for (const auto& need : needs) ++book_.layer_group_stats[static_cast<std::size_t>(need.second)].allocated_pages;
  }
  if (enabled_) {
    KVCacheStatsDelta d;
    d.allocated_pages = needs.size();
    for (const auto& need : needs) d.generation_allocated_pages += need.first >= first_generation_block_;
    add_pending(d);
  }
}

void RequestStats::committed_block() {
  if (!excluded) book_.context.count(&CacheStats::committed_blocks, 1);
  if (enabled_) {
    KVCacheStatsDelta d;
    d.committed_blocks = 1;
    add_pending(d);
  }
}

void RequestStats::attached(int layer_group) {
  if (excluded) return;
  const auto i = static_cast<std::size_t>(layer_group);
  ++book_.layer_group_stats[i].committed_pages;
  book_.ssm.stored += book_.is_ssm[i];
}

void RequestStats::snapshot_skipped(const std::vector<int>& layer_groups) {
  if (excluded) return;
  for (int group : layer_groups) book_.ssm.skipped += book_.is_ssm[static_cast<std::size_t>(group)];
}

void RequestStats::require_enabled(const char* api) const {
  if (!enabled_) {
    throw Error(ErrorKind::kLogic, std::string(api) + "() needs a KV cache created with enable_request_stats=True");
  }
}

KVCacheStatsDelta RequestStats::commit() {
  require_enabled("commit_pending_stats");
  const KVCacheStatsDelta out = pending_;
  pending_ = KVCacheStatsDelta{};
  book_.dirty.erase(cache_id_);
  return out;
}

void RequestStats::discard() {
  require_enabled("discard_pending_stats");
  pending_ = KVCacheStatsDelta{};
  book_.dirty.erase(cache_id_);
}

}  // namespace kvcore
