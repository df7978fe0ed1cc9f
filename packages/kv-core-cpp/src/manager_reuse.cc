// The manager's reuse (manager_reuse.py): the radix tree's match of a prompt, its back-off and
// cuts, the probes that report it, and the caches created on it. Every member REQUIRES: the
// manager's lock, except the public ones, which take it.
#include <algorithm>
#include <cstring>
#include <string>

#include "kvcore/error.h"
#include "kvcore/manager.h"

namespace kvcore {

MatchPath KVCacheManager::match(const Digest& root_key, const Tokens& tokens, bool with_backoff,
                                std::optional<std::int64_t> max_reused) {
  // The reusable prefix: walk, back off and cap (unless not `with_backoff`), then cut until the endpoint
  // has an SSM snapshot taken exactly there and every attention layer group has, for each block it
  // needs at the endpoint, a page covering the matched tokens.
  MatchPath path =
      tree_.walk(root_key, tokens, config_.tokens_per_block, config_.key_format, config_.enable_partial_reuse);
  return prune(with_backoff ? back_off(std::move(path), max_reused) : std::move(path));
}

namespace {

std::int64_t sum_tokens(const MatchPath& path) {
  std::int64_t total = 0;
  for (const auto& step : path) total += step.second;
  return total;
}

}  // namespace

MatchPath KVCacheManager::match_fetching(const Digest& root_key, const ReuseScope& scope, const Tokens& tokens,
                                         std::optional<std::int64_t> max_reused, std::vector<const Block*>& fetched,
                                         std::optional<Misses>& misses) {
  // What is staged goes first, so the match may find it in the store; here, before the walk: the
  // store's code may run finalisers that close caches, which must not change a walk under way.
  if (remote_ != nullptr) remote_->hand();
  MatchPath path =
      tree_.walk(root_key, tokens, config_.tokens_per_block, config_.key_format, config_.enable_partial_reuse);
  if (remote_ != nullptr) fetched = fetch_remote(root_key, scope, tokens, path, max_reused);
  if (!config_.reuse_report) return prune(back_off(std::move(path), max_reused));
  // The walk's misses first, then what backing off and pruning cut from it.
  const std::int64_t walked = sum_tokens(path);
  const auto full = static_cast<std::size_t>(walked / config_.tokens_per_block);
  misses = find_misses(tree_, root_key, tokens, walked, full ? path[full - 1].first : nullptr,
                       config_.enable_partial_reuse, config_.key_format);
  path = back_off(std::move(path), max_reused);
  const std::int64_t backed = sum_tokens(path);
  path = prune(std::move(path));
  misses->capped = walked - backed;
  misses->stale = backed - sum_tokens(path);
  return path;
}

std::vector<const Block*> KVCacheManager::fetch_remote(const Digest& root_key, const ReuseScope& scope,
                                                       const Tokens& tokens, MatchPath& path,
                                                       std::optional<std::int64_t> max_reused) {
  const std::int64_t tokens_per_block = config_.tokens_per_block;
  std::size_t full = 0;
  while (full < path.size() && path[full].second == tokens_per_block) ++full;
  const auto num_tokens = static_cast<std::int64_t>(tokens.count);
  const std::int64_t limit = max_reused ? std::min(num_tokens, *max_reused) : num_tokens;
  const std::int64_t count = limit / tokens_per_block - static_cast<std::int64_t>(full);
  if (count <= 0) return {};
  Block* parent = full ? path[full - 1].first : nullptr;
  const Digest parent_key = full ? parent->key : root_key;
  std::vector<std::uint8_t> out(32 * static_cast<std::size_t>(count + 1));
  chained_keys(parent_key, tokens, full, static_cast<std::size_t>(count), static_cast<std::size_t>(tokens_per_block),
               config_.key_format, out.data());
  std::vector<Digest> keys(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(keys[i].data(), out.data() + 32 * (i + 1), 32);
  const TokenList list =
      TokenList::from(tokens, 0, static_cast<std::size_t>(limit / tokens_per_block * tokens_per_block));
  std::vector<const Page*> kept;
  for (const auto& step : path) {
    for (const Page* p : step.first->pages) {
      if (p != nullptr) kept.push_back(p);
    }
  }
  const PageSet keep(kept);
  // The root is looked up (or made) once room is made, which may prune it (fetch); the parent
  // block is pinned meanwhile, so that a page-less one is not pruned from under us.
  struct Pin {
    Block* block;
    ~Pin() {
      if (block != nullptr) --block->pins;
    }
  } pin{parent};
  if (parent != nullptr) ++parent->pins;
  const std::vector<Block*> blocks =
      remote_->fetch(parent, parent_key, keys, static_cast<std::int64_t>(full), list, keep, scope);
  if (blocks.empty()) return {};
  path.resize(full);
  for (Block* block : blocks) path.emplace_back(block, tokens_per_block);
  return {blocks.begin(), blocks.end()};
}

MatchPath KVCacheManager::back_off(MatchPath path, std::optional<std::int64_t> max_reused) const {
  std::int64_t backoff = config_.reuse_match_backoff;
  if (max_reused) {
    // The cap applies after the config's backoff: whichever leaves fewer tokens wins.
    std::int64_t total = 0;
    for (const auto& step : path) total += step.second;
    backoff = std::max(backoff, total - *max_reused);
  }
  while (backoff > 0 && !path.empty()) {
    auto& [block, n] = path.back();
    if (n > backoff) {
      n -= backoff;
      backoff = 0;
    } else {
      backoff -= n;
      path.pop_back();
    }
  }
  return path;
}

MatchPath KVCacheManager::prune(MatchPath path, bool ssm) const {
  bool changed = true;
  while (changed && !path.empty()) {
    changed = ssm && prune_ssm(path);
    if (changed) continue;
    std::int64_t total = 0;
    for (const auto& step : path) total += step.second;
    for (int layer_group : registry_.block_layer_groups()) {
      if (changed) break;
      const auto [begin, end] = registry_.stale_range(layer_group, total);
      for (std::size_t i = 0; i < path.size(); ++i) {
        const auto ordinal = static_cast<std::int64_t>(i);
        if (begin <= ordinal && ordinal < end) continue;
        Block* block = path[i].first;
        const Page* page = block->pages[layer_group];
        const std::int64_t coverage = page ? page->num_tokens : 0;
        if (coverage < path[i].second) {
          path.resize(i);
          if (coverage) path.emplace_back(block, coverage);
          changed = true;
          break;
        }
      }
    }
  }
  return path;
}

bool KVCacheManager::prune_ssm(MatchPath& path) const {
  // Cut to the last block with an SSM snapshot inside its matched tokens, at the snapshot's
  // length (a state is valid at one position only); empty without one. Whether it changed.
  for (int layer_group : registry_.ssm_layer_groups()) {
    std::size_t keep = 0;
    for (std::size_t ordinal = 0; ordinal < path.size(); ++ordinal) {
      const Page* page = path[ordinal].first->pages[layer_group];
      if (page != nullptr && 0 < page->num_tokens && page->num_tokens <= path[ordinal].second) keep = ordinal + 1;
    }
    if (keep == 0) {
      path.clear();
      return true;
    }
    Block* block = path[keep - 1].first;
    const std::int64_t coverage = block->pages[layer_group]->num_tokens;
    if (keep < path.size() || coverage != path[keep - 1].second) {
      path.resize(keep - 1);
      path.emplace_back(block, coverage);
      return true;
    }
  }
  return false;
}

std::int64_t KVCacheManager::probe_reuse(const ReuseScope& scope, const Tokens& tokens,
                                         std::optional<std::int64_t> max_reused) {
  const auto lock = context_.lock();
  require_live();
  std::int64_t total = 0;
  for (const auto& step : match(root_key(scope), tokens, true, max_reused)) total += step.second;
  return total;
}

KVCacheManager::ReuseMatch KVCacheManager::probe_reuse_match(const ReuseScope& scope, const Tokens& tokens,
                                                             std::optional<std::int64_t> max_reused) {
  const auto lock = context_.lock();
  require_live();
  const auto sum = [](const MatchPath& path) {
    std::int64_t total = 0;
    for (const auto& step : path) total += step.second;
    return total;
  };
  MatchPath walked =
      tree_.walk(root_key(scope), tokens, config_.tokens_per_block, config_.key_format, config_.enable_partial_reuse);
  const std::int64_t divergence = sum(walked);
  MatchPath backed = back_off(std::move(walked), max_reused);
  const std::int64_t attention = sum(prune(backed, false));
  return {static_cast<std::int64_t>(tokens.count), divergence, attention, sum(prune(std::move(backed)))};
}

std::optional<Digest> KVCacheManager::probe_first_new_block_key(const ReuseScope& scope, const Tokens& tokens,
                                                                std::optional<std::int64_t> max_reused) {
  const auto lock = context_.lock();
  require_live();
  const Digest root = root_key(scope);
  const std::int64_t tokens_per_block = config_.tokens_per_block;
  std::int64_t reusable = 0;
  for (const auto& step : match(root, tokens, true, max_reused)) reusable += step.second;
  const std::int64_t k = reusable / tokens_per_block;
  const auto n = static_cast<std::int64_t>(tokens.count);
  if (reusable >= n || (k + 1) * tokens_per_block > n) return std::nullopt;
  std::vector<std::uint8_t> keys(32 * static_cast<std::size_t>(k + 2));
  chained_keys(root, tokens, 0, static_cast<std::size_t>(k + 1), static_cast<std::size_t>(tokens_per_block),
               config_.key_format, keys.data());
  Digest key;
  std::memcpy(key.data(), keys.data() + 32 * static_cast<std::size_t>(k + 1), key.size());
  return key;
}

std::unique_ptr<KVCache> KVCacheManager::create_kv_cache(const ReuseScope& scope, const Tokens& tokens,
                                                         std::optional<std::int64_t> id, PriorityCallback priority,
                                                         std::optional<std::int64_t> expected_prompt_length,
                                                         std::optional<bool> text_only, bool enable_request_stats,
                                                         std::optional<std::int64_t> max_reused_tokens) {
  const auto lock = context_.lock();
  require_live();
  const std::int64_t cache_id = id.value_or(next_id_);
  const bool text = text_only.value_or(config_.text_only);
  if (text) {
    if (const auto digest = first_digest(tokens)) throw_text_only("input_tokens", *digest);
  }
  RequestStats stats(stats_, cache_id, enable_request_stats,
                     expected_prompt_length.value_or(static_cast<std::int64_t>(tokens.count)), text);
  const Digest root = root_key(scope);
  std::vector<const Block*> fetched;
  std::optional<Misses> misses;
  const MatchPath path = match_fetching(root, scope, tokens, max_reused_tokens, fetched, misses);
  const std::int64_t reused = sum_tokens(path);
  Misses* missed = misses ? &*misses : nullptr;
  auto cache = std::make_unique<KVCache>(context_, cache_id, scope, root,
                                         TokenList::from(tokens, 0, static_cast<std::size_t>(reused)), path,
                                         std::move(priority), std::move(stats), fetched, missed);
  next_id_ = std::max(next_id_, cache_id) + 1;
  context_.register_cache(cache.get());
  cache->stats.created(tokens.count, static_cast<std::uint64_t>(reused),
                       !path.empty() && !registry_.ssm_layer_groups().empty(), missed);
  if (tree_.ghost != nullptr) tree_.ghost->tick();  // the ghost record's clock counts caches created
  return cache;
}

}  // namespace kvcore
