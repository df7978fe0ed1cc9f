// The remote tier (docs/store.md; mirrors remote_tier.py): a match that ends locally continues
// in a BlockStore and what it finds enters the tree on the last local level; committed full
// blocks are written through. Every value is checked before it is used; every store fault is a
// miss, counted.
//
// Values (kv_api.block_value): a little-endian header naming the block and the layout, with the
// CRC-32s of itself and of the payload (crc32.h), then each layer group's page (zeros where it
// has none), so both backends write and check the same bytes.
//
// The manager owns it and builds it after its CacheContext; it borrows the store (the binding's,
// which outlives the manager), the storage, the tree, the registry, the event manager and the
// context. Every member REQUIRES: the manager's lock (docs/architecture.md, Threads).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvcore/block_store.h"
#include "kvcore/cache_context.h"
#include "kvcore/config.h"
#include "kvcore/storage.h"

namespace kvcore {

class RemoteTier {
 public:
  RemoteTier(const RemoteTierConfig& tier, const KVCacheManagerConfig& config, CacheContext& context,
             BlockStore& store);
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // Blocks first, first + 1, ... (`keys` theirs; `tokens` holds at least their tokens, from the
  // chain's start) from the store, placed on the last local level and added under `parent`
  // (under the scope's root, parent_key, when nullptr: looked up or made once room is made):
  // the consecutive ones the store has and whose values pass every check. `keep`: pages making
  // room must not evict (the local match).
  std::vector<Block*> fetch(Node* parent, const Digest& parent_key, const std::vector<Digest>& keys, std::int64_t first,
                            const TokenList& tokens, const PageSet& keep, const ReuseScope& scope);
  // A full block that entered the tree in this call, to write at flush().
  void add_pending(Block* block) { pending_.push_back(block); }
  // Stages this call's new full blocks, their bytes copied and encoded now, and hands the store
  // what is staged (one put) once that is kHandBlocks blocks or kHandBytes bytes (a decode's
  // one block a put cost the engine's thread a store call each); between begin_batch() and
  // end_batch() (a batched call's caches) it waits for end_batch().
  void flush();
  // Hands the store every staged block (one put): at a cache's close, when a cache is created
  // (before its match, which may read the store).
  void hand();
  void begin_batch() { ++batches_; }
  void end_batch() {
    --batches_;
    flush();
  }

 private:
  // A store's count answer: in [0, n], else 0 and counted as an error.
  std::int64_t checked_count(std::int64_t answer, std::size_t n);
  bool valid(const std::uint8_t* value, const Digest& key, const Digest& parent, std::int64_t ordinal) const;
  bool complete(const std::uint8_t* value, std::int64_t ordinal) const;
  std::vector<std::vector<bool>> kept(const std::uint8_t* buffer, std::int64_t first, std::int64_t count) const;
  std::vector<std::vector<Page*>> place(const std::uint8_t* buffer, std::int64_t first, std::int64_t count,
                                        const PageSet& keep);
  std::vector<std::vector<Page*>> fill(const std::uint8_t* buffer, const std::vector<std::vector<bool>>& kept,
                                       const std::vector<std::uint64_t>& need);
  Block* add(Node* parent, const Digest& key, const TokenList& tokens, std::int64_t ordinal,
             const std::vector<Page*>& pages, std::optional<std::uint64_t> lora);
  bool writable(const Block* block) const;
  void encode(const Block* block, std::uint8_t* value) const;  // the header, the payload being there
  std::uint64_t length(const std::uint8_t* value, std::size_t layer_group) const;
  std::string store_key(const Digest& key) const;

  BlockStore& store_;
  std::string namespace_;
  std::string fingerprint_;
  std::int64_t tokens_per_block_;
  CacheContext& context_;
  const LifeCycleRegistry& registry_;
  Storage& storage_;
  RadixTree& tree_;
  KVCacheEventManager* events_;
  int level_;                                // where the blocks it brings land: the last local level
  std::vector<std::uint64_t> page_sizes_;    // per layer group, its page's bytes
  std::vector<std::uint64_t> page_offsets_;  // per layer group, where its page starts in a value
  std::uint64_t header_;
  std::uint64_t value_size_;
  std::vector<Block*> pending_;           // in the order they entered the tree; a block leaving it leaves this
  std::vector<std::uint8_t> staged_;      // values staged for the next put, back to back
  std::vector<std::string> staged_keys_;  // their store keys
  int batches_ = 0;                       // begin_batch() calls not ended: flush() waits
  double paused_until_ = 0;               // the store's pause (put's answer), in steady-clock seconds
};

}  // namespace kvcore
