// Pages: one slot of one layer group's pool group at one cache level, holding one block's KV data;
// mirrors page.py.
//
// A Page is a plain record owned by Storage: its address is stable while the page lives, through
// every move between levels and slots, and a record is recycled only after the page is freed
// (never inside a make_room plan), its generation bumped so that a planned-drop handle kept
// across can tell. Caches, tree blocks, eviction queues and planned-drop handles point to records
// and own none. Storage alone changes a page's slot, level, holders, locks and queue links.
// Every field REQUIRES: the manager's lock (the thread rule: docs/architecture.md, Threads).
#pragma once

#include <cstdint>

namespace kvcore {

class Block;

struct Page {
  std::uint64_t slot = 0;
  int level = 0;  // the cache level its slot is at
  int layer_group = 0;
  int pool_group = 0;
  int priority = 0;
  Block* block = nullptr;       // set once committed
  std::int64_t num_tokens = 0;  // tokens of the block this page is valid for
  int holders = 0;              // caches keeping the page (held or locked)
  int locks = 0;                // caches locking it (active)
  bool queued = false;          // in its level's eviction queue
  int planned_drops = 0;        // planned-drop handles covering it, not dropped yet (planned_drop.h)
  // Bumped each time the record is retired: a planned-drop handle knows its page by (record,
  // generation), so a page freed meanwhile, its record reused, is not taken for the new one.
  std::uint64_t generation = 0;
  // Its neighbours in its eviction queue's priority bucket, while queued: an intrusive list, so
  // queuing and dequeuing a page (every hold, lock and release) allocates nothing.
  Page* queue_prev = nullptr;
  Page* queue_next = nullptr;

  bool committed() const { return block != nullptr; }
  // Freed while a make_room plan still points to it (Python's `block is None and holders == 0`).
  bool dead() const { return block == nullptr && holders == 0; }
};

}  // namespace kvcore
