// Pages: one slot of one life cycle's pool group, holding one block's KV data (see page.py).
// Pages live in their pool group's table, indexed by slot: a slot has at most one page.
#pragma once

#include <cstdint>
#include <list>

namespace kvcore {

class Block;

struct Page {
  std::uint64_t slot = 0;
  int life_cycle = 0;
  int pool_group = 0;
  int priority = 0;
  Block* block = nullptr;                // set once committed
  std::int64_t num_tokens = 0;           // tokens of the block this page is valid for
  int holders = 0;                       // caches keeping the page (held or locked)
  int locks = 0;                         // caches locking it (active)
  std::list<Page*>::iterator queue_pos;  // its place in the eviction queue, while evictable

  bool committed() const { return block != nullptr; }
};

}  // namespace kvcore
