// KV-cache events for KV-aware routers (docs/manager.md, "Events"; mirrors event_manager.py).
//
// Guarantees: the manager's hooks queue events as the tree changes; a block is announced Stored
// once per layer group (by key), and Removed or Updated there only if it was announced.
// flush_iteration_events publishes what is queued to the ring, which get_latest_events drains; a
// ring that would overflow is resynced instead, the events it drops counted in dropped_events
// (max_kv_event_entries <= 0 keeps none).
// The caller keeps the event manager alive while a manager is bound to it (the binding's manager
// holds a reference); the manager unsets its resync when it goes.
//
// Threads: it has locks of its own. mutex_ guards the ring, the queued events and the counters,
// so the public calls need no manager's lock and may come from any thread. The hooks stored,
// removed, updated and resync_to REQUIRE: the manager's lock (the announced set and the blocks'
// cached v1 hashes are the manager's state). Lock order: resync_mutex_, then the manager's lock,
// then mutex_. The thread rule: docs/architecture.md, Threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "kvcore/radix_tree.h"

namespace kvcore {

enum class HashAlgo { kV2Sha256, kV2Sha256_64, kV1BlockKey };
HashAlgo parse_hash_algo(const std::string& name);  // "auto" is v1_block_key; Error(kValue)
const char* hash_algo_name(HashAlgo algo);

using BlockHash = std::variant<std::string, std::uint64_t>;

struct StoredBlockEvent {
  BlockHash block_hash;
  TokenList tokens;
  int cache_level = 0;
  int priority = 0;
  std::optional<std::uint64_t> lora_id;
};

struct Event {
  enum class Kind { kCreated, kStored, kRemoved, kUpdated };
  std::int64_t id = 0;
  Kind kind = Kind::kCreated;
  std::vector<std::uint64_t> num_blocks_per_cache_level;  // created
  std::optional<BlockHash> parent_hash;                   // stored
  std::vector<StoredBlockEvent> blocks;                   // stored
  std::vector<BlockHash> block_hashes;                    // removed; updated: the one block
  std::pair<int, int> cache_level{0, 0};                  // updated: (old, new)
  std::optional<std::int64_t> window_size;
  std::optional<int> layer_group_id;
};

class KVCacheEventManager {
 public:
  // The constructor, dropped_events, flush_iteration_events and get_latest_events check the poison
  // latch first (poison.h); the two fixed accessors do not (the binding checks it for them).
  KVCacheEventManager(std::int64_t max_kv_event_entries, HashAlgo algo);

  HashAlgo hash_algo() const { return algo_; }
  std::int64_t max_kv_event_entries() const { return max_entries_; }
  std::uint64_t dropped_events();  // dropped from a full ring (each overflow resyncs)
  // Publishes the queued events; a ring they would overflow is resynced by the bound manager, or
  // without one loses its oldest events (counted). Call it without the manager's lock: a resync
  // takes resync_mutex_ before that lock.
  void flush_iteration_events();
  // Drains published events; timeout_ms < 0 waits for some, > 0 waits that long at most.
  std::vector<Event> get_latest_events(double timeout_ms);

  // Hooks the manager calls: bind(), set_resync() and created() while it is being built
  // (set_resync() from its destructor too); stored(), removed(), updated() and resync_to()
  // REQUIRE: the manager's lock.
  void bind(std::vector<std::optional<std::int64_t>> windows);  // Error(kValue) if bound twice
  // What runs resync_to under the manager's lock when the ring would overflow (nullptr: the
  // manager going away; it waits for a resync under way).
  void set_resync(std::function<void()> resync);
  // REQUIRES: the manager's lock. The ring and the queued events dropped (counted), then Created
  // and the announced pages of the tree under `roots` (per layer group, parent before child,
  // siblings in key order).
  void resync_to(std::vector<std::uint64_t> num_blocks_per_cache_level, const std::vector<Root*>& roots);
  void created(std::vector<std::uint64_t> num_blocks_per_cache_level);
  // `lora`: the block's scope's LoRA adapter (a block does not keep it: the caller knows it).
  void stored(Block* block, int layer_group, int priority, int cache_level, std::optional<std::uint64_t> lora);
  void removed(Block* block, int layer_group);
  // A page of an announced block moved between cache levels.
  void updated(Block* block, int layer_group, int old_level, int new_level);

 private:
  void queue(Event event, std::optional<int> layer_group);
  void append_stored(Block* block, int layer_group, int priority, int cache_level, std::optional<std::uint64_t> lora);
  void flush_removed();
  BlockHash hash(Block* block);
  std::uint64_t v1(Block* block);

  std::int64_t max_entries_;
  HashAlgo algo_;
  std::mutex mutex_;
  std::condition_variable published_;
  std::deque<Event> ring_;
  std::vector<Event> pending_;
  std::vector<std::pair<int, std::vector<BlockHash>>> removed_;  // per layer group, first-use order
  std::set<std::pair<Digest, int>> stored_;
  // The v1 hashes computed (and whether each fell back), by block key: a v1 hash is a function
  // of the key's chain and scope, so an entry never goes stale. Kept here, not in the blocks (a
  // tree holds millions and v1_block_key is the legacy format); bounded: cleared when it grows
  // past twice the announced blocks, and recomputed from the chain as needed.
  std::unordered_map<Digest, std::pair<std::uint64_t, bool>, DigestHash> v1_;
  std::int64_t next_id_ = 0;
  std::vector<std::optional<std::int64_t>> windows_;
  bool bound_ = false;
  std::mutex resync_mutex_;  // guards resync_: held while it runs, so unbind() waits for it
  std::function<void()> resync_;
  std::uint64_t dropped_ = 0;
};

}  // namespace kvcore
