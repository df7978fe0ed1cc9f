#include "kvcore/event_manager.h"

#include <algorithm>
#include <chrono>

#include "kvcore/error.h"
#include "kvcore/event_hash.h"
#include "kvcore/poison.h"

namespace kvcore {

HashAlgo parse_hash_algo(const std::string& name) {
  if (name == "v2_sha256") return HashAlgo::kV2Sha256;
  if (name == "v2_sha256_64") return HashAlgo::kV2Sha256_64;
  if (name == "v1_block_key" || name == "auto") return HashAlgo::kV1BlockKey;
  throw Error(ErrorKind::kValue, "hash_algo: Unsupported V2 KV cache event hash algorithm: '" + name +
                                     "' (expected auto, v2_sha256, v2_sha256_64, v1_block_key)");
}

const char* hash_algo_name(HashAlgo algo) {
  switch (algo) {
    case HashAlgo::kV2Sha256:
      return "v2_sha256";
    case HashAlgo::kV2Sha256_64:
      return "v2_sha256_64";
    case HashAlgo::kV1BlockKey:
      return "v1_block_key";
  }
  return "";
}

KVCacheEventManager::KVCacheEventManager(std::int64_t max_kv_event_entries, HashAlgo algo)
    : max_entries_(max_kv_event_entries), algo_(algo) {
  poison::check();
}

void KVCacheEventManager::flush_iteration_events() {
  poison::check();
  std::lock_guard<std::mutex> lock(mutex_);
  flush_removed();
  if (max_entries_ > 0) {
    for (Event& e : pending_) {
      ring_.push_back(std::move(e));
      if (static_cast<std::int64_t>(ring_.size()) > max_entries_) ring_.pop_front();
    }
  }
  pending_.clear();
  published_.notify_all();
}

std::vector<Event> KVCacheEventManager::get_latest_events(double timeout_ms) {
  poison::check();
  std::unique_lock<std::mutex> lock(mutex_);
  if (ring_.empty() && timeout_ms != 0) {
    if (timeout_ms < 0) {
      published_.wait(lock, [this] { return !ring_.empty(); });
    } else {
      published_.wait_for(lock, std::chrono::duration<double, std::milli>(timeout_ms),
                          [this] { return !ring_.empty(); });
    }
  }
  std::vector<Event> out(std::make_move_iterator(ring_.begin()), std::make_move_iterator(ring_.end()));
  ring_.clear();
  return out;
}

void KVCacheEventManager::bind(std::vector<std::optional<std::int64_t>> windows) {
  if (bound_) throw Error(ErrorKind::kValue, "event_manager: already used by another KVCacheManager");
  bound_ = true;
  windows_ = std::move(windows);
}

void KVCacheEventManager::created(std::vector<std::uint64_t> num_blocks_per_cache_level) {
  Event e;
  e.kind = Event::Kind::kCreated;
  e.num_blocks_per_cache_level = std::move(num_blocks_per_cache_level);
  std::lock_guard<std::mutex> lock(mutex_);
  queue(std::move(e), std::nullopt);
}

void KVCacheEventManager::stored(Block* block, int life_cycle, int priority, int cache_level) {
  if (!stored_.insert({block->key, life_cycle}).second) return;
  std::optional<BlockHash> parent_hash;
  if (!block->parent->is_root()) parent_hash = hash(static_cast<Block*>(block->parent));
  StoredBlockEvent sb{hash(block), block->tokens, cache_level, priority, block->lora_id};
  std::lock_guard<std::mutex> lock(mutex_);
  flush_removed();
  if (!pending_.empty()) {
    Event& last = pending_.back();
    if (last.kind == Event::Kind::kStored && last.layer_group_id == life_cycle && parent_hash &&
        last.blocks.back().block_hash == *parent_hash) {
      last.blocks.push_back(std::move(sb));
      return;
    }
  }
  Event e;
  e.kind = Event::Kind::kStored;
  e.parent_hash = parent_hash;
  e.blocks.push_back(std::move(sb));
  queue(std::move(e), life_cycle);
}

void KVCacheEventManager::removed(Block* block, int life_cycle) {
  if (stored_.erase({block->key, life_cycle}) == 0) return;  // never announced
  BlockHash h = hash(block);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(removed_.begin(), removed_.end(), [&](const auto& r) { return r.first == life_cycle; });
  if (it == removed_.end()) {
    removed_.push_back({life_cycle, {}});
    it = removed_.end() - 1;
  }
  it->second.push_back(std::move(h));
}

void KVCacheEventManager::updated(Block* block, int life_cycle, int old_level, int new_level) {
  if (stored_.count({block->key, life_cycle}) == 0) return;
  Event e;
  e.kind = Event::Kind::kUpdated;
  e.block_hashes.push_back(hash(block));
  e.cache_level = {old_level, new_level};
  std::lock_guard<std::mutex> lock(mutex_);
  queue(std::move(e), life_cycle);
}

void KVCacheEventManager::queue(Event event, std::optional<int> life_cycle) {
  flush_removed();
  event.id = next_id_++;
  event.layer_group_id = life_cycle;
  if (life_cycle) event.window_size = windows_[*life_cycle];
  pending_.push_back(std::move(event));
}

void KVCacheEventManager::flush_removed() {
  std::vector<std::pair<int, std::vector<BlockHash>>> removed;
  removed.swap(removed_);
  for (auto& [lc, hashes] : removed) {
    Event e;
    e.kind = Event::Kind::kRemoved;
    e.block_hashes = std::move(hashes);
    e.id = next_id_++;
    e.layer_group_id = lc;
    e.window_size = windows_[lc];
    pending_.push_back(std::move(e));
  }
}

BlockHash KVCacheEventManager::hash(Block* block) {
  switch (algo_) {
    case HashAlgo::kV2Sha256:
      return block_hash_v2_sha256(block->key);
    case HashAlgo::kV2Sha256_64:
      return block_hash_v2_sha256_64(block->key);
    case HashAlgo::kV1BlockKey:
      return v1(block);
  }
  return std::uint64_t{0};
}

std::uint64_t KVCacheEventManager::v1(Block* block) {
  // Chained from the root; a block with a digest token, and every descendant, falls back to
  // v2_sha256_64. Iterative: chains may be thousands of blocks deep.
  std::vector<Block*> chain;
  Node* node = block;
  while (!node->is_root() && !static_cast<Block*>(node)->v1_hash) {
    chain.push_back(static_cast<Block*>(node));
    node = node->parent;
  }
  std::uint64_t parent_hash = 0;
  bool fell_back = false;
  if (!node->is_root()) std::tie(parent_hash, fell_back) = *static_cast<Block*>(node)->v1_hash;
  while (!node->is_root()) node = node->parent;
  const ReuseScope& scope = static_cast<Root*>(node)->scope;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    Block* b = *it;
    if (fell_back || !b->tokens.digests.empty()) {
      parent_hash = block_hash_v2_sha256_64(b->key);
      fell_back = true;
    } else {
      parent_hash = block_hash_v1(b->tokens.view(), parent_hash, scope);
    }
    b->v1_hash = std::make_pair(parent_hash, fell_back);
  }
  return block->v1_hash->first;
}

}  // namespace kvcore
