// The ghost record (docs/manager.md, "Why a prompt missed"; mirrors ghost_record.py): the keys of
// the last full blocks that left the tree, each with the cache level it was dropped from and
// when, so that a prompt's missed block can be told apart as evicted rather than never seen.
//
// At most `capacity` keys, oldest forgotten first. Time is counted in caches created (tick()): an
// entry's age is how many were created since it was recorded. No lock of its own: the tree's
// (REQUIRES: the manager's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>

#include "kvcore/radix_tree.h"
#include "kvcore/sha256.h"

namespace kvcore {

// A recorded block: the level it was dropped from and its age (kv_api.stats.EvictedBlock).
struct EvictedBlock {
  int level;
  std::int64_t age;
};

class GhostRecord {
 public:
  explicit GhostRecord(std::int64_t capacity) : capacity_(capacity) {}
  GhostRecord(const GhostRecord&) = delete;
  GhostRecord& operator=(const GhostRecord&) = delete;

  std::size_t size() const noexcept { return entries_.size(); }
  std::int64_t clock() const noexcept { return clock_; }
  void tick() noexcept { ++clock_; }  // a cache was created
  // A full block left the tree, dropped from `level`; a key recorded again becomes the newest.
  void record(const Digest& key, int level);
  void forget(const Digest& key) noexcept;  // the block is back in the tree
  std::optional<EvictedBlock> find(const Digest& key) const;

 private:
  // A map node, linked oldest to newest through the nodes themselves: one allocation a key
  // (node-based, so the links survive a rehash).
  struct Entry {
    int level;
    std::int64_t clock;
    const Digest* key;  // the node's own key, to erase the oldest by
    Entry* older;
    Entry* newer;
  };

  void unlink(Entry& entry) noexcept;

  std::int64_t capacity_;
  std::int64_t clock_ = 0;  // caches created so far
  std::unordered_map<Digest, Entry, DigestHash> entries_;
  Entry* oldest_ = nullptr;
  Entry* newest_ = nullptr;
};

}  // namespace kvcore
