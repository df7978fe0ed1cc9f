#include "kvcore/event_manager.h"

#include <algorithm>
#include <chrono>

#include "kvcore/error.h"
#include "kvcore/event_hash.h"
#include "kvcore/page.h"
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

std::uint64_t KVCacheEventManager::dropped_events() {
  poison::check();
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

void KVCacheEventManager::flush_iteration_events() {
  poison::check();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_removed();
    if (max_entries_ <= 0) {
      pending_.clear();
      return;
    }
    if (static_cast<std::int64_t>(ring_.size() + pending_.size()) <= max_entries_) {
      for (Event& e : pending_) ring_.push_back(std::move(e));
      pending_.clear();
      published_.notify_all();
      return;
    }
  }
  {
    // The manager's lock, then mutex_: the order its hooks take them in.
    std::lock_guard<std::mutex> guard(resync_mutex_);
    if (resync_) {
      resync_();
      return;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);  // no manager to resync from: the oldest drop, counted
  for (Event& e : pending_) ring_.push_back(std::move(e));
  pending_.clear();
  while (static_cast<std::int64_t>(ring_.size()) > max_entries_) {
    ring_.pop_front();
    ++dropped_;
  }
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

void KVCacheEventManager::set_resync(std::function<void()> resync) {
  std::lock_guard<std::mutex> guard(resync_mutex_);
  resync_ = std::move(resync);
}

namespace {

// Every block under `roots`, parent before child, roots and siblings in key order.
// Every block under `roots`, parent before child, roots and siblings in key order, with its
// scope's LoRA adapter.
std::vector<std::pair<Block*, std::optional<std::uint64_t>>> blocks_in_key_order(const std::vector<Root*>& roots) {
  std::vector<std::pair<Node*, const Root*>> stack;
  for (Root* root : roots) stack.emplace_back(root, root);
  const auto by_key_descending = [](const auto& a, const auto& b) { return b.first->key < a.first->key; };
  std::sort(stack.begin(), stack.end(), by_key_descending);
  std::vector<std::pair<Block*, std::optional<std::uint64_t>>> out;
  while (!stack.empty()) {
    const auto [node, root] = stack.back();
    stack.pop_back();
    if (!node->is_root()) out.emplace_back(static_cast<Block*>(node), root->scope.lora_id);
    const std::size_t first = stack.size();
    for (Block* child : node->children()) stack.emplace_back(child, root);
    std::sort(stack.begin() + static_cast<std::ptrdiff_t>(first), stack.end(), by_key_descending);
  }
  return out;
}

}  // namespace

void KVCacheEventManager::resync_to(std::vector<std::uint64_t> num_blocks_per_cache_level,
                                    const std::vector<Root*>& roots) {
  const auto blocks = blocks_in_key_order(roots);
  std::lock_guard<std::mutex> lock(mutex_);
  flush_removed();
  dropped_ += ring_.size() + pending_.size();
  ring_.clear();
  pending_.clear();
  Event created;
  created.kind = Event::Kind::kCreated;
  created.num_blocks_per_cache_level = std::move(num_blocks_per_cache_level);
  queue(std::move(created), std::nullopt);
  for (int group = 0; group < static_cast<int>(windows_.size()); ++group) {
    for (const auto& [block, lora] : blocks) {
      const Page* page = block->pages[group];
      if (page != nullptr && stored_.count({block->key, group}) != 0)
        append_stored(block, group, page->priority, page->level, lora);
    }
  }
  for (Event& e : pending_) ring_.push_back(std::move(e));
  pending_.clear();
  published_.notify_all();
}

void KVCacheEventManager::created(std::vector<std::uint64_t> num_blocks_per_cache_level) {
  Event e;
  e.kind = Event::Kind::kCreated;
  e.num_blocks_per_cache_level = std::move(num_blocks_per_cache_level);
  std::lock_guard<std::mutex> lock(mutex_);
  queue(std::move(e), std::nullopt);
}

void KVCacheEventManager::stored(Block* block, int layer_group, int priority, int cache_level,
                                 std::optional<std::uint64_t> lora) {
  if (!stored_.insert({block->key, layer_group}).second) return;
  std::lock_guard<std::mutex> lock(mutex_);
  flush_removed();
  append_stored(block, layer_group, priority, cache_level, lora);
}

void KVCacheEventManager::append_stored(Block* block, int layer_group, int priority, int cache_level,
                                        std::optional<std::uint64_t> lora) {
  // With mutex_ held: merged into the last queued event where it extends that event's chain.
  std::optional<BlockHash> parent_hash;
  if (!block->parent->is_root()) parent_hash = hash(static_cast<Block*>(block->parent));
  StoredBlockEvent sb{hash(block), block->tokens().to_list(), cache_level, priority, lora};
  if (!pending_.empty()) {
    Event& last = pending_.back();
    if (last.kind == Event::Kind::kStored && last.layer_group_id == layer_group && parent_hash &&
        last.blocks.back().block_hash == *parent_hash) {
      last.blocks.push_back(std::move(sb));
      return;
    }
  }
  Event e;
  e.kind = Event::Kind::kStored;
  e.parent_hash = parent_hash;
  e.blocks.push_back(std::move(sb));
  queue(std::move(e), layer_group);
}

void KVCacheEventManager::removed(Block* block, int layer_group) {
  if (stored_.erase({block->key, layer_group}) == 0) return;  // never announced
  BlockHash h = hash(block);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(removed_.begin(), removed_.end(), [&](const auto& r) { return r.first == layer_group; });
  if (it == removed_.end()) {
    removed_.push_back({layer_group, {}});
    it = removed_.end() - 1;
  }
  it->second.push_back(std::move(h));
}

void KVCacheEventManager::updated(Block* block, int layer_group, int old_level, int new_level) {
  if (stored_.count({block->key, layer_group}) == 0) return;
  Event e;
  e.kind = Event::Kind::kUpdated;
  e.block_hashes.push_back(hash(block));
  e.cache_level = {old_level, new_level};
  std::lock_guard<std::mutex> lock(mutex_);
  queue(std::move(e), layer_group);
}

void KVCacheEventManager::queue(Event event, std::optional<int> layer_group) {
  flush_removed();
  event.id = next_id_++;
  event.layer_group_id = layer_group;
  if (layer_group) event.window_size = windows_[*layer_group];
  pending_.push_back(std::move(event));
}

void KVCacheEventManager::flush_removed() {
  std::vector<std::pair<int, std::vector<BlockHash>>> removed;
  removed.swap(removed_);
  for (auto& [group, hashes] : removed) {
    Event e;
    e.kind = Event::Kind::kRemoved;
    e.block_hashes = std::move(hashes);
    e.id = next_id_++;
    e.layer_group_id = group;
    e.window_size = windows_[group];
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
  if (const auto it = v1_.find(block->key); it != v1_.end()) return it->second.first;
  if (v1_.size() > 2 * stored_.size() + 1024) v1_.clear();  // the bound: recomputed below
  std::vector<Block*> chain;
  Node* node = block;
  auto known = v1_.end();
  while (!node->is_root() && (known = v1_.find(node->key)) == v1_.end()) {
    chain.push_back(static_cast<Block*>(node));
    node = node->parent;
  }
  std::uint64_t parent_hash = 0;
  bool fell_back = false;
  if (!node->is_root()) std::tie(parent_hash, fell_back) = known->second;
  while (!node->is_root()) node = node->parent;
  const ReuseScope& scope = static_cast<Root*>(node)->scope;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    Block* b = *it;
    if (fell_back || b->tokens().has_digests()) {
      parent_hash = block_hash_v2_sha256_64(b->key);
      fell_back = true;
    } else {
      parent_hash = block_hash_v1(b->tokens().view(), parent_hash, scope);
    }
    v1_[b->key] = {parent_hash, fell_back};
  }
  return parent_hash;
}

}  // namespace kvcore
