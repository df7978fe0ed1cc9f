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

// 56 bytes, the small fields packed (a tree holds millions of pages): a page's tokens are at
// most tokens_per_block (<= 2**20, kv_api's TOKENS_PER_BLOCK_LIMIT), a level one of the three
// page tiers, a priority within [kMinPriority, kMaxPriority] (0-100); its pool group is its
// layer group's (Storage::pool_group), not kept.
struct Page {
  Page() : num_tokens(0), level(0), priority(0), queued(0), planned(0) {}

  std::uint64_t slot = 0;
  Block* block = nullptr;  // set once committed
  // Its neighbours in its eviction queue's priority bucket, while queued: an intrusive list, so
  // queuing and dequeuing a page (every hold, lock and release) allocates nothing.
  Page* queue_prev = nullptr;
  Page* queue_next = nullptr;
  // Bumped each time the record is retired: a planned-drop handle knows its page by (record,
  // generation), so a page freed meanwhile, its record reused, is not taken for the new one.
  std::uint64_t generation = 0;
  std::uint32_t num_tokens : 21;  // tokens of the block this page is valid for
  std::uint32_t level : 2;        // the cache level its slot is at
  std::uint32_t priority : 7;
  std::uint32_t queued : 1;   // in its level's eviction queue
  std::uint32_t planned : 1;  // planned-drop handles cover it, not dropped yet (Storage counts them)
  int layer_group = 0;
  int holders = 0;  // caches keeping the page (held or locked)
  int locks = 0;    // caches locking it (active)

  bool committed() const { return block != nullptr; }
  // Freed while a make_room plan still points to it (Python's `block is None and holders == 0`).
  bool dead() const { return block == nullptr && holders == 0; }
};
static_assert(sizeof(void*) != 8 || sizeof(Page) == 56, "a page record's size is docs/performance.md's");

}  // namespace kvcore
