// Committing a cache into the radix tree (cache_commit.py): tokens recorded, full blocks entering
// the tree, a block already there taking our place (rebase), commit_min_snapshot's snapshots,
// and the stop.
#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/ghost_record.h"
#include "kvcore/kv_cache.h"
#include "kvcore/remote_tier.h"

namespace kvcore {

namespace {

constexpr std::int64_t kGhostAhead = 8;  // blocks whose ghost-record line is asked for ahead
constexpr std::size_t kFewKeys = 4;      // keys hashed on the stack

}  // namespace

void KVCache::commit(const TokenList& tokens, bool is_end, const std::uint8_t* keys) {
  commit(tokens.view(), 0, tokens.size(), is_end, keys);
}

void KVCache::commit(const Tokens& src, std::size_t begin, std::size_t end, bool is_end, const std::uint8_t* keys) {
  const auto lock = context_.lock();
  require(CacheStatus::kActive, "commit");
  require_commit_allowed();
  if (stats.text_only()) {
    for (const DigestToken& d : src.digests) {
      if (d.position >= begin && d.position < end) throw_text_only("tokens", d.position - begin);
    }
  }
  const auto committed = static_cast<std::int64_t>(tokens_.size());
  const auto added = static_cast<std::int64_t>(end - begin);
  if (committed + added > capacity_) {
    throw Error(ErrorKind::kValue, "commit: " + std::to_string(committed) + " committed + " + std::to_string(added) +
                                       " new tokens exceed capacity " + std::to_string(capacity_));
  }
  const bool min_snapshot = context_.commit_min_snapshot();
  if (min_snapshot && history_ != committed && history_ != committed + added) {
    throw Error(ErrorKind::kLogic, "commit: with commit_min_snapshot, history_length (" + std::to_string(history_) +
                                       ") must equal the committed tokens before (" + std::to_string(committed) +
                                       ") or after (" + std::to_string(committed + added) + ") the commit");
  }
  check_scratch_history("commit", capacity_, std::max(history_, committed + added));
  const std::int64_t first = committed / tokens_per_block_;
  tokens_.append(src, begin, end);
  history_ = std::max(history_, static_cast<std::int64_t>(tokens_.size()));
  const std::int64_t last = static_cast<std::int64_t>(tokens_.size()) / tokens_per_block_;
  // A decode step's usual commit: what the rest finds here is no scratch, nothing stale, no
  // block filled, no snapshot.
  if (full_attention_only_ && !min_snapshot && last == first && !is_end) {
    if (context_.remote != nullptr) context_.remote->flush();  // what a stop_committing() added
    return;
  }
  // A longer history leaves fewer scratch blocks.
  for (int group : block_layer_groups_) {
    free_scratch(group, static_cast<std::size_t>(scratch_need(group, capacity_, history_)));
  }
  // With commit_min_snapshot, pages out of the window go before their blocks could enter the tree.
  if (min_snapshot) apply_stale_releases(stale_releases(history_), history_);
  // The new full blocks' keys in one chain call (a prefill's hundreds of blocks) unless the
  // caller hashed them: each block committed is the next one's parent, under that key.
  // A decode step's block is hashed into `few` (no allocation: see Storage's lists), a prefill's
  // into `own`.
  std::array<std::uint8_t, 32 * (kFewKeys + 1)> few;
  std::vector<std::uint8_t> own;
  if (keys == nullptr && last > first) {
    if (const auto parent = commit_keys_parent_at(first)) {
      const auto n = static_cast<std::size_t>(last - first);
      if (n > kFewKeys) own.resize(32 * (n + 1));
      std::uint8_t* out = n > kFewKeys ? own.data() : few.data();
      hash_keys(*parent, first, last, out);
      keys = out + 32;
    }
  }
  if (last > first) prompt_keys_.clear();  // what it held is committed (or is not the prompt)
  // Each block added leaves the ghost record: its index line is asked for some blocks ahead.
  const GhostRecord* ghost = keys != nullptr ? context_.tree().ghost.get() : nullptr;
  const auto ask = [&](std::int64_t ordinal) {
    if (ghost != nullptr && ordinal < last) ghost->prefetch(keys + 32 * static_cast<std::size_t>(ordinal - first));
  };
  for (std::int64_t ordinal = first; ordinal < first + kGhostAhead; ++ordinal) ask(ordinal);
  for (std::int64_t ordinal = first; ordinal < last; ++ordinal) {
    ask(ordinal + kGhostAhead);
    commit_block(ordinal, nullptr, keys == nullptr ? nullptr : keys + 32 * static_cast<std::size_t>(ordinal - first));
  }
  if (min_snapshot && added > 0 && !is_end) snapshot(false);
  apply_stale_releases(stale_releases(history_), history_);
  if (is_end) stop_committing_locked(min_snapshot);
  if (context_.remote != nullptr) context_.remote->flush();
}

void KVCache::hash_keys(const Digest& parent, std::int64_t first, std::int64_t last, std::uint8_t* out) const {
  // The keys the reuse report hashed first, where they hold for these tokens, then the rest.
  const auto tokens_per_block = static_cast<std::size_t>(tokens_per_block_);
  const std::size_t count = static_cast<std::size_t>(last - first);
  const std::size_t known = prompt_keys_.usable(parent, tokens_, first, count, tokens_per_block);
  std::memcpy(out, parent.data(), 32);
  if (known > 0) std::memcpy(out + 32, prompt_keys_.at(first), 32 * known);
  if (known == count) return;
  Digest from;
  std::memcpy(from.data(), out + 32 * known, 32);
  chained_keys(from, tokens_.view(), static_cast<std::size_t>(first) + known, count - known, tokens_per_block,
               context_.key_format(), out + 32 * known);
}

std::optional<Digest> KVCache::commit_keys_parent_at(std::int64_t ordinal) const {
  // parent_node's key, without creating the scope's root (block 0 chains from the root key).
  if (commit_state_ == CommitState::kVirtualStop) return std::nullopt;
  if (ordinal == 0) return root_key_;
  const Block* parent = blocks_[static_cast<std::size_t>(ordinal - 1)].tree_block;
  if (parent == nullptr) return std::nullopt;
  return parent->key;
}

KeyFormat KVCache::key_format() const { return context_.key_format(); }

std::optional<Digest> KVCache::commit_keys_parent() const {
  return commit_keys_parent_at(num_committed_tokens() / tokens_per_block_);
}

Node* KVCache::parent_node(std::int64_t ordinal) {
  if (ordinal == 0) return context_.tree().root(root_key_, scope_);
  return blocks_[ordinal - 1].tree_block;
}

void KVCache::commit_block(std::int64_t ordinal, const std::vector<Page*>* pages, const std::uint8_t* key_bytes) {
  // Put block `ordinal` (full, or the partial tail on stop) into the tree. A block already
  // there keeps the pages covering it and ours are given up for them (rebase); ours fill the
  // layer groups it lacks or covers only in part. A partial block a sibling extends is not added
  // (ours stay private); a new block replaces the partial sibling it extends and adopts its
  // pages. Without a parent in the tree the cache stops committing.
  if (commit_state_ == CommitState::kVirtualStop) return;
  Node* parent = parent_node(ordinal);
  if (parent == nullptr) {
    commit_state_ = CommitState::kVirtualStop;
    return;
  }
  CacheBlock& cache_block = blocks_[ordinal];
  const std::size_t begin = static_cast<std::size_t>(ordinal * tokens_per_block_);
  const std::size_t end = std::min(begin + static_cast<std::size_t>(tokens_per_block_), tokens_.size());
  Digest key;
  if (key_bytes != nullptr) {
    std::memcpy(key.data(), key_bytes, key.size());
  } else {
    std::uint8_t keys[64];  // the parent's key, then this block's
    chained_keys(parent->key, tokens_.view(), static_cast<std::size_t>(ordinal), 1,
                 static_cast<std::size_t>(tokens_per_block_), context_.key_format(), keys);
    std::memcpy(key.data(), keys + 32, key.size());
  }
  const auto num_tokens = static_cast<std::int64_t>(end - begin);
  const bool full = num_tokens == tokens_per_block_;
  Block* block = parent->child(key);
  if (block == nullptr) {
    Block* shorter = nullptr;
    if (!parent->children().empty()) {  // siblings to compare with (the next block of a new chain has none)
      const TokenList tokens = tokens_.slice(begin, end);
      if (!full && RadixTree::covering_sibling(parent, tokens) != nullptr) return;
      shorter = RadixTree::covered_sibling(parent, tokens);
    }
    block = context_.tree().add(parent, key, tokens_, begin, end, ordinal);
    stats.committed_block();
    if (full && context_.remote != nullptr) context_.remote->add_pending(block);
    if (shorter != nullptr) context_.storage().adopt(block, shorter);
  }
  Page* const* ours_by_group = pages == nullptr ? cache_block.pages.data() : pages->data();
  for (int group = 0; group < static_cast<int>(num_layer_groups_); ++group) {
    join(block, ordinal, group, ours_by_group[group], num_tokens);
  }
  if (cache_block.tree_block == nullptr && full) {
    // Later blocks hang under a full block, so it stays in the tree while we are open (we hold
    // all its pages). A partial tail is the last block: nothing hangs under it, and when it
    // already existed we keep our private page and hold none of its pages.
    cache_block.tree_block = block;
    ++block->pins;
  } else {
    context_.tree().prune(block);  // a new partial block none of our pages went into
  }
}

void KVCache::join(Block* block, std::int64_t ordinal, int layer_group, Page* ours, std::int64_t num_tokens) {
  // The tree's page, when it covers the block, replaces ours (rebase), or ours takes its place;
  // otherwise ours, uncommitted, becomes the tree block's.
  CacheBlock& cache_block = blocks_[ordinal];
  Page* theirs = block->pages[layer_group];
  if (theirs == nullptr || theirs->num_tokens < num_tokens) {
    if (ours != nullptr && !ours->committed()) attach(block, layer_group, ours, num_tokens);
    return;
  }
  if (ours == nullptr || ours == theirs || num_tokens != tokens_per_block_) return;
  Storage& storage = context_.storage();
  const bool locked = cache_block.locked[layer_group];
  if (locked && theirs->level != kGpuLevel) {
    if (theirs->holders) {
      // Another cache holds the tree's page and pins the block on it: the page stays the
      // block's, and we hold it too, so it outlives our pin as well; ours stays private.
      storage.hold(theirs);
      tree_holds_.push_back(theirs);
    } else {
      // The tree's copy sits on a colder level and ours, locked, is on the device: ours takes
      // its place (we hold it, so nothing drops the block).
      storage.replace(block, layer_group, ours);
    }
    return;
  }
  storage.hold(theirs);
  if (locked) {
    unlock_page(ordinal, layer_group);
    cache_block.pages[layer_group] = theirs;
    lock_page(ordinal, layer_group);
  } else {
    cache_block.pages[layer_group] = theirs;
  }
  storage.unhold(ours);
}

void KVCache::attach(Block* block, int layer_group, Page* page, std::int64_t num_tokens) {
  // A page the block had covers fewer tokens (an adopted one covering a prefix): orphaned.
  if (block->pages[layer_group] != nullptr) context_.storage().orphan(block->pages[layer_group]);
  page->block = block;
  page->num_tokens = num_tokens;
  block->pages[layer_group] = page;
  stats.attached(layer_group);
  if (KVCacheEventManager* events = context_.events())
    events->stored(block, layer_group, page->priority, page->level, scope_.lora_id);
}

bool KVCache::snapshot_sources(Block*& block, std::vector<std::pair<int, Page*>>& sources) const {
  const auto n = static_cast<std::int64_t>(tokens_.size());
  if (n == 0 || commit_state_ == CommitState::kVirtualStop) return false;
  std::vector<std::pair<int, Page*>> states;
  for (int group : ssm_layer_groups_) {
    if (ssm_state_[group] != nullptr && !ssm_state_[group]->committed()) states.emplace_back(group, ssm_state_[group]);
  }
  if (n % tokens_per_block_ != 0) {
    block = nullptr;
    const CacheBlock& cache_block = blocks_[n / tokens_per_block_];
    if (cache_block.copy_on_resume) return false;  // a reused partial block not copied yet: nothing of ours
    for (int group : block_layer_groups_) {
      Page* page = cache_block.pages[group];
      if (page != nullptr && !page->committed()) sources.emplace_back(group, page);
    }
    sources.insert(sources.end(), states.begin(), states.end());
    return true;
  }
  block = blocks_[n / tokens_per_block_ - 1].tree_block;
  if (block == nullptr) return false;
  for (const auto& [group, page] : states) {  // the full block is in the tree already: only states it lacks
    if (block->pages[group] == nullptr || block->pages[group]->num_tokens < tokens_per_block_) {
      sources.emplace_back(group, page);
    }
  }
  return true;
}

void KVCache::snapshot(bool move) {
  // What a request reusing exactly the committed tokens needs: a partial tail's attention pages
  // and the SSM states, each valid for the committed tokens of its block. Copies are made only
  // if room can be (no snapshot else: it is a cache, not state).
  Block* block = nullptr;
  std::vector<std::pair<int, Page*>> sources;
  if (!snapshot_sources(block, sources) || sources.empty()) return;
  std::vector<Page*> pages;
  for (const auto& source : sources) pages.push_back(source.second);
  if (!move) {
    pages = copies(pages);
    if (pages.empty()) {
      std::vector<int> groups;
      for (const auto& source : sources) groups.push_back(source.first);
      stats.snapshot_skipped(groups);
      return;
    }
  }
  if (block == nullptr) {
    std::vector<Page*> override(num_layer_groups_, nullptr);
    for (std::size_t i = 0; i < sources.size(); ++i) override[sources[i].first] = pages[i];
    commit_block(num_committed_tokens() / tokens_per_block_, &override);
  } else {
    for (std::size_t i = 0; i < sources.size(); ++i) attach(block, sources[i].first, pages[i], tokens_per_block_);
  }
  if (!move) {
    for (Page* page : pages) context_.storage().unhold(page);  // the tree keeps those that went in
  }
}

std::vector<Page*> KVCache::copies(const std::vector<Page*>& sources) {
  Storage& storage = context_.storage();
  std::vector<std::pair<int, int>> requests;
  for (const Page* p : sources) requests.emplace_back(p->layer_group, p->priority);
  std::vector<Page*> pages;
  try {
    pages = storage.new_pages(requests);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kOutOfPages) return {};
    throw;
  }
  for (Page* p : pages) p->holders = 1;
  try {
    for (std::size_t i = 0; i < sources.size(); ++i) storage.copy(sources[i], pages[i]);
  } catch (...) {
    for (Page* p : pages) storage.unhold(p);
    throw;
  }
  return pages;
}

void KVCache::stop_committing() {
  const auto lock = context_.lock();
  stop_committing_locked();
}

void KVCache::stop_committing_locked(bool move_state) {
  // `move_state` (commit_min_snapshot, is_end): the live tail pages and SSM states go into the
  // tree, not copies of them.
  if (commit_state_ == CommitState::kUserStop || status_ == CacheStatus::kClosed) return;
  const auto n = static_cast<std::int64_t>(tokens_.size());
  const std::int64_t ordinal = n / tokens_per_block_;
  if (move_state) {
    snapshot(true);
  } else if (n % tokens_per_block_ && ordinal < num_blocks() && !blocks_[ordinal].copy_on_resume) {
    commit_block(ordinal);
  }
  commit_state_ = CommitState::kUserStop;
  apply_stale_releases(stale_releases(history_), history_);
}

std::unique_ptr<PlannedDropHandle> KVCache::plan_committed_block_drop() {
  const auto lock = context_.lock();
  if (commit_state_ != CommitState::kUserStop) {
    throw Error(ErrorKind::kLogic, "plan_committed_block_drop() requires stop_committing()");
  }
  return plan_drop(context_, root_key_, tokens_);
}

}  // namespace kvcore
