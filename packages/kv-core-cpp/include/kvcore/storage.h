// The cache levels (each with its pool groups: slot allocators, real memory, eviction), the page
// records, moving pages between levels, and what dropping a committed page does to the radix
// tree (docs/manager.md, "Eviction and tiers"; mirrors storage.py).
//
// Guarantees: a page record keeps its address while its page lives, through every move between
// levels and slots, and is recycled only once the page is freed and no RecordGuard lives (its
// generation bumped). Making room (new_pages, make_room, resize_level) plans every pool group
// before anything moves, so Error(kOutOfPages) leaves the pages as they were (a full disk found
// on the way may have shrunk its level, counted in num_disk_full). A copy that fails once moves
// began (the copier's error, disk I/O) leaves each page where it was before its own move, the
// drops and moves before it done; a page failing its checksum is taken out of the tree first.
//
// Storage owns the levels (and through them every pool, slot allocator, eviction queue and disk
// file), the page records and the PageTransfer. It borrows the StorageConfig, the registry, the
// tree and the event manager, which the manager declares before it and so outlive it, and the
// copier, which the manager's caller keeps alive.
//
// Threads: no lock of its own; every member REQUIRES: the manager's lock (the thread rule:
// docs/architecture.md, Threads).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvcore/cache_level.h"
#include "kvcore/config.h"
#include "kvcore/event_manager.h"
#include "kvcore/eviction.h"
#include "kvcore/kept_list.h"
#include "kvcore/life_cycles.h"
#include "kvcore/page.h"
#include "kvcore/page_set.h"
#include "kvcore/page_transfer.h"
#include "kvcore/radix_tree.h"
#include "kvcore/storage_config.h"

namespace kvcore {

class Storage {
 public:
  // Builds every level of config.cache_tiers (slot counts, memory, disk files) in order.
  Storage(const KVCacheManagerConfig& manager_config, const StorageConfig& config, const LifeCycleRegistry& registry,
          RadixTree& tree, KVCacheEventManager* events, PageCopier* copier);

  int num_levels() const { return static_cast<int>(levels_.size()); }
  int last_level() const { return num_levels() - 1; }
  CacheLevel& level(int index) { return *levels_[index]; }
  const CacheLevel& level(int index) const { return *levels_[index]; }
  std::deque<PoolGroup>& pool_groups() { return levels_[0]->pool_groups; }  // the device level's
  PoolGroup& pool_group_of(const Page* page) { return levels_[page->level]->pool_groups[pool_group(page)]; }
  // The index of the pool group holding `page` (its layer group's).
  int pool_group(const Page* page) const { return config_.pool_group_of(page->layer_group); }
  const StorageConfig& config() const { return config_; }
  std::vector<StorageStatistics> statistics(int level = 0) const;
  PageTransfer& transfer() { return transfer_; }
  void close();  // removes the disk files
  // While a guard lives, freed page records are kept (dead()) and recycled when it goes, so a
  // plan's pointers never dangle.
  class RecordGuard {
   public:
    explicit RecordGuard(Storage& storage) : storage_(storage) { ++storage_.guards_; }
    ~RecordGuard() {
      if (--storage_.guards_ == 0) storage_.recycle();
    }
    RecordGuard(const RecordGuard&) = delete;
    RecordGuard& operator=(const RecordGuard&) = delete;

   private:
    Storage& storage_;
  };

  // -- page status (docs/manager.md, "Eviction and tiers") --
  // Not locked, and committed and droppable, or held above the last level.
  bool evictable(const Page* page) const;
  void hold(Page* page, std::optional<int> priority = std::nullopt);  // a higher priority (reuse) re-queues it
  void unhold(Page* page);  // an uncommitted page nobody holds is freed at once
  void lock(Page* page);    // Error(kCorrupted), poisoning the core, below the device level
  void unlock(Page* page);
  void free(Page* page);  // releases its slot (the record stays: see retire)
  // Planned-drop handles covering a page (planned_drop.h): counted here, not in every record (a
  // tree holds millions of pages, few of them planned); the page's `planned` bit says it has
  // some. plan_drop may throw std::bad_alloc (nothing changed); unplan_drop says whether it was
  // the last.
  void plan_drop(Page* page);
  bool unplan_drop(Page* page) noexcept;

  // -- new pages and copies --
  // One device page per (layer group, priority), all or none (Error kOutOfPages, nothing changed).
  std::vector<Page*> new_pages(const std::vector<std::pair<int, int>>& requests);
  // The same into `out` (cleared first), with no allocation once the scratch has grown: a decode
  // step's new page is in every step of a long run, and glibc hands a heap of millions of blocks
  // its coldest small chunks first.
  void new_pages(const std::vector<std::pair<int, int>>& requests, std::vector<Page*>& out);
  // From any level; a source that fails its checksum is forgotten (Error(kOS), EIO).
  void copy(Page* src, const Page* dst);

  // -- making room --
  // What making room does in one pool group: pages moved down (to a level), the last level's
  // victims (dropped in order while room is short) and falling pages that find no slot there
  // (droppable, dropped).
  struct Plan {
    std::vector<std::pair<Page*, int>> moves;
    std::vector<Page*> drops;
    std::vector<Page*> lost;
  };
  // Per pool group, what make_room would do; Error(kOutOfPages) (nothing changed) when need[pg]
  // slots cannot be freed at `level` or held pages would find no slot. `pending` pages join
  // `level`'s queues first and freed[pg] slots are freed there first (a resize's releases).
  std::vector<Plan> plan(int level, const std::vector<std::uint64_t>& need, const PageSet& exclude = {},
                         const std::vector<Page*>& pending = {}, const std::vector<std::uint64_t>& freed = {});
  // The same into `plans` (one per pool group; their lists emptied and reused).
  void plan(int level, const std::vector<std::uint64_t>& need, const PageSet& exclude,
            const std::vector<Page*>& pending, const std::vector<std::uint64_t>& freed, std::vector<Plan>& plans);
  bool can_make_room(int level, const std::vector<std::uint64_t>& need, const std::vector<Page*>& pending = {},
                     const std::vector<std::uint64_t>& freed = {});
  // Frees need[pg] slots at `level` by cascading eviction, or throws: Error(kOutOfPages) before
  // anything moved, a failing copy as the opening comment says.
  void make_room(int level, const std::vector<std::uint64_t>& need, const PageSet& exclude = {});
  // Moves pages (one level, one pool group) to dst_level, which has the free slots.
  void move(const std::vector<Page*>& pages, int dst_level);
  // `pages` came back from disk with bytes that fail their checksum: counted, taken out of the
  // tree (announced as removed; each stays its holders'), then Error(kOS) with EIO.
  [[noreturn]] void forget_corrupt(const std::vector<Page*>& pages);
  // Moves pages from colder levels to dst_level (room made), per pool group then source level.
  void move_up(const std::vector<Page*>& pages, int dst_level);

  // -- quota resize --
  // Gives `level` the slot counts of `counts`: new memory first, then room made in each
  // shrinking group (Error(kOutOfPages), nothing changed, if it cannot be), then its pages in
  // slots beyond the new size moved to free low slots, then the pools remapped. `live` is every
  // page the tree or a cache has.
  void resize_level(int level, const SlotCounts& counts, const std::vector<Page*>& live);

  // -- pages from outside a cache (the remote tier's) --
  // A new page record for a slot of `level` already allocated (no holder, no block yet).
  Page* new_page_at(int level, int layer_group, std::uint64_t slot, int priority);
  // A page of new_page_at that never entered the tree: its slot and record released.
  void free_new(Page* page);
  // A page that entered the tree from outside a cache joins its queue.
  void settle(Page* page) { update(page); }

  // -- the tree's pages --
  // `block` replaces `sibling`, a partial block whose tokens it extends (see Storage.adopt).
  void adopt(Block* block, Block* sibling);
  // `page` leaves the tree undropped (a wider page or a longer block replaced it): freed now if
  // nobody holds it, else when its holders let go, as an uncommitted page is.
  void replace(Block* block, int layer_group, Page* page);
  void orphan(Page* page);
  void drop(Page* page);
  // Drops a committed droppable page out of turn (a planned drop): as an eviction would, but not
  // counted as one.
  void drop_now(Page* page);
  void clear();
  std::uint64_t num_evicted = 0;    // pages evicted from the device level
  std::uint64_t num_onboarded = 0;  // pages moved up to the device level
  std::uint64_t num_corrupt = 0;    // pages whose bytes failed their checksum on the way up
  std::uint64_t num_disk_full = 0;  // times the disk tier's file system was full (its level shrank)

 private:
  void update(Page* page);   // queued or not as its status says; a page staying evictable keeps its place
  void dequeue(Page* page);  // out of its queue, if queued
  // Disk blocks for every page the plans send to disk; false when a full disk shrank its level.
  bool back_disks(int level, const std::vector<Plan>& plans);
  void evict_drop(Page* page);
  void move_down(const std::vector<Page*>& pages, int dst_level);
  void discard(Block* block, int layer_group);
  Page* new_record();
  void retire(Page* page);  // the record is unreferenced: recycled (once no RecordGuard lives)
  void recycle();

  const StorageConfig& config_;
  const LifeCycleRegistry& registry_;
  RadixTree& tree_;
  KVCacheEventManager* events_;
  std::vector<std::unique_ptr<CacheLevel>> levels_;
  PageTransfer transfer_;
  std::deque<Page> records_;  // every page record; a deque grown at the back never moves them
  std::vector<Page*> free_records_;
  // Lists kept for the next call (kept_list.h), so that a decode step's new page, its eviction
  // and the moves down it makes allocate nothing. new_pages': slots needed per pool group, the
  // slots taken and where each group's start; plan's; make_room's plans and batches of moves;
  // move_down's and move's.
  KeptList<std::uint64_t> new_need_;
  KeptList<std::uint64_t> new_slots_;
  KeptList<std::size_t> new_first_;
  KeptList<Page*> plan_arrivals_;
  KeptList<Page*> plan_queued_;
  KeptList<Page*> plan_chosen_;
  KeptList<Plan> plans_;
  KeptList<Page*> move_batch_;
  KeptList<Page*> move_dropped_;
  KeptList<Page*> move_movers_;
  KeptList<std::uint64_t> move_slots_;
  KeptList<std::pair<std::uint64_t, std::uint64_t>> move_pairs_;
  std::vector<Page*> retired_;                    // freed while a RecordGuard lives
  std::unordered_map<const Page*, int> planned_;  // plan_drop's counts, for pages whose bit is set
  int guards_ = 0;
};

}  // namespace kvcore
