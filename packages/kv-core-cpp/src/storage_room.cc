// Storage, making room (storage.h): plans of what to move down or drop on a level, the cascade
// that carries them out, and the moves of pages between levels. In its own file for its size;
// kv_core_py keeps it in storage.py.
#include <algorithm>
#include <cerrno>
#include <string>

#include "kvcore/error.h"
#include "kvcore/ghost_record.h"
#include "kvcore/poison.h"
#include "kvcore/prefetch.h"
#include "kvcore/storage.h"

namespace kvcore {

// How many drops ahead make_room asks for a dropped page's block.
constexpr std::size_t kPrefetchDrops = 8;

// -- making room ---------------------------------------------------------------------------------

std::vector<Storage::Plan> Storage::plan(int level, const std::vector<std::uint64_t>& need, const PageSet& exclude,
                                         const std::vector<Page*>& pending, const std::vector<std::uint64_t>& freed) {
  std::vector<Plan> plans;
  plan(level, need, exclude, pending, freed, plans);
  return plans;
}

void Storage::plan(int level, const std::vector<std::uint64_t>& need, const PageSet& exclude,
                   const std::vector<Page*>& pending, const std::vector<std::uint64_t>& freed,
                   std::vector<Plan>& plans) {
  plans.resize(pool_groups().size());
  Borrowed<Page*> arrivals_list(plan_arrivals_);
  Borrowed<Page*> queued_list(plan_queued_);
  Borrowed<Page*> chosen_list(plan_chosen_);
  std::vector<Page*>& arrivals = *arrivals_list;
  std::vector<Page*>& queued = *queued_list;
  std::vector<Page*>& chosen = *chosen_list;
  for (std::size_t pg = 0; pg < pool_groups().size(); ++pg) {
    Plan& plan = plans[pg];
    plan.moves.clear();
    plan.drops.clear();
    plan.lost.clear();
    auto goal = static_cast<std::int64_t>(need[pg]);
    arrivals.clear();
    for (int lv = level; lv < num_levels(); ++lv) {
      PoolGroup& group = levels_[lv]->pool_groups[pg];
      auto free = static_cast<std::int64_t>(group.allocator.num_free());
      queued.clear();
      if (lv == level) {
        if (!freed.empty()) free += static_cast<std::int64_t>(freed[pg]);
        for (Page* p : pending) {
          if (pool_group(p) == static_cast<int>(pg)) queued.push_back(p);
        }
      }
      const std::int64_t want = goal + static_cast<std::int64_t>(arrivals.size()) - free;
      chosen.clear();
      if (want > 0) group.evictable.candidates(static_cast<std::size_t>(want), exclude, queued, chosen);
      const auto num_chosen = static_cast<std::int64_t>(chosen.size());
      const std::int64_t room = free + num_chosen - goal;  // slots left for the pages falling in
      auto short_of_slots = [&] {
        return Error(ErrorKind::kOutOfPages, "pool group " + std::to_string(pg) + ": need " + std::to_string(goal) +
                                                 " slots, " + std::to_string(free) + " free and " +
                                                 std::to_string(num_chosen) + " evictable");
      };
      if (lv == last_level()) {
        const auto held = std::count_if(arrivals.begin(), arrivals.end(), [](const Page* p) { return p->holders > 0; });
        if (room < held) {
          if (lv == level) throw short_of_slots();
          throw Error(ErrorKind::kOutOfPages, "cache level " + std::to_string(lv) + ", pool group " +
                                                  std::to_string(pg) + ": " + std::to_string(held) +
                                                  " held pages fall in, " + std::to_string(free) + " free and " +
                                                  std::to_string(num_chosen) + " evictable");
        }
        plan.drops.swap(chosen);
        const std::int64_t lose = std::max<std::int64_t>(0, static_cast<std::int64_t>(arrivals.size()) - room);
        for (Page* p : arrivals) {
          if (static_cast<std::int64_t>(plan.lost.size()) == lose) break;
          if (!p->holders) plan.lost.push_back(p);
        }
        for (Page* p : arrivals) {
          if (std::find(plan.lost.begin(), plan.lost.end(), p) == plan.lost.end()) plan.moves.emplace_back(p, lv);
        }
      } else {
        if (room < 0) throw short_of_slots();
        // The least valuable fall further.
        const auto passing =
            static_cast<std::size_t>(std::max<std::int64_t>(0, static_cast<std::int64_t>(arrivals.size()) - room));
        for (std::size_t i = passing; i < arrivals.size(); ++i) plan.moves.emplace_back(arrivals[i], lv);
        arrivals.resize(passing);
        chosen.insert(chosen.end(), arrivals.begin(), arrivals.end());
        arrivals.swap(chosen);
      }
      goal = 0;
    }
  }
}

bool Storage::can_make_room(int level, const std::vector<std::uint64_t>& need, const std::vector<Page*>& pending,
                            const std::vector<std::uint64_t>& freed) {
  try {
    plan(level, need, {}, pending, freed);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kOutOfPages) return false;
    throw;
  }
  return true;
}

void Storage::make_room(int level, const std::vector<std::uint64_t>& need, const PageSet& exclude) {
  // Disk blocks for the pages that may fall there are allocated before anything moves. Each pool
  // group's plan runs deepest level first (the last level's drops, then the moves into each
  // level), so every slot is emptied before it is filled. The plan's pages stay pointed to
  // throughout: records freed meanwhile (a subtree removal) are recycled after.
  if (std::all_of(need.begin(), need.end(), [](std::uint64_t n) { return n == 0; })) return;  // a decode step
  const RecordGuard guard(*this);
  Borrowed<Plan> plans_list(plans_, true);  // plan() empties each Plan's lists, keeping their memory
  std::vector<Plan>& plans = *plans_list;
  plan(level, need, exclude, {}, {}, plans);
  while (!back_disks(level, plans)) plan(level, need, exclude, {}, {}, plans);  // the smaller disk: drops, not moves
  for (std::size_t pg = 0; pg < plans.size(); ++pg) {
    const Plan& plan = plans[pg];
    PoolGroup& last = levels_[last_level()]->pool_groups[pg];
    std::uint64_t target = level == last_level() ? need[pg] : 0;
    for (const auto& [p, d] : plan.moves) {
      if (d == last_level() && !p->dead()) ++target;
    }
    const std::vector<Page*>& drops = plan.drops;
    for (std::size_t i = 0; i < drops.size(); ++i) {
      if (last.allocator.num_free() >= target) break;
      // The blocks of evicted pages were last touched long ago, and each drop reads its block
      // and its parent (the block the next drop reads, a closed request's pages being queued
      // last block first): the block some drops ahead is asked for now.
      if (i + kPrefetchDrops < drops.size()) {
        if (const Block* ahead = drops[i + kPrefetchDrops]->block) prefetch_lines(ahead, sizeof(Block));
      }
      // Its ghost-record line, for a block asked for above some drops ago (loaded by now).
      if (tree_.ghost != nullptr && i + kPrefetchDrops / 2 < drops.size()) {
        if (const Block* ahead = drops[i + kPrefetchDrops / 2]->block) tree_.ghost->prefetch(ahead->key.data());
      }
      if (!drops[i]->dead()) evict_drop(drops[i]);
    }
    for (Page* page : plan.lost) {
      if (!page->dead()) evict_drop(page);
    }
    for (int dst = last_level(); dst > level; --dst) {
      for (int src = level; src < dst; ++src) {
        Borrowed<Page*> batch(move_batch_);
        for (const auto& [p, d] : plan.moves) {
          if (d == dst && !p->dead() && p->level == src) (*batch).push_back(p);
        }
        move_down(*batch, dst);
      }
    }
  }
}

bool Storage::back_disks(int level, const std::vector<Plan>& plans) {
  // A file system that cannot give the blocks shrinks its level to the slots it has (counted):
  // false, the plans are made again, so a full disk means dropping instead of moving down.
  for (std::size_t pg = 0; pg < plans.size(); ++pg) {
    for (int lv = level + 1; lv < num_levels(); ++lv) {
      PoolGroup& group = levels_[lv]->pool_groups[pg];
      if (group.disk_pools.empty()) continue;
      const auto arriving = static_cast<std::uint64_t>(std::count_if(plans[pg].moves.begin(), plans[pg].moves.end(),
                                                                     [lv](const auto& m) { return m.second == lv; }));
      try {
        group.ensure_backed(arriving);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kDiskOOM) throw;
        group.shrink_to_backed();
        ++num_disk_full;
        return false;
      }
    }
  }
  return true;
}

void Storage::forget_corrupt(const std::vector<Page*>& pages) {
  // Counted, out of the tree (announced as removed) so no match finds them again, then
  // OSError(EIO): a miss from now on, never data. Only pages a cache holds are read, so each
  // stays its holders' until they let go (see Storage.forget_corrupt).
  num_corrupt += pages.size();
  const std::string directory = pool_group_of(pages[0]).disk_pools[0].directory();
  for (Page* page : pages) {
    Block* block = page->block;
    if (block == nullptr) continue;
    block->pages[page->layer_group] = nullptr;
    if (events_) events_->removed(block, page->layer_group);
    orphan(page);
    tree_.prune(block);
  }
  throw Error(
      ErrorKind::kOS,
      "disk tier: " + std::to_string(pages.size()) + " page(s) failed their checksum in " + directory + ": dropped",
      EIO);
}

void Storage::evict_drop(Page* page) {
  if (page->level == 0) ++num_evicted;
  dequeue(page);
  drop(page);
}

void Storage::move_down(const std::vector<Page*>& pages, int dst_level) {
  // If dst_level lacks slots for all (a drop took fewer pages than planned), the first
  // droppable ones drop instead.
  if (pages.empty()) return;
  const int src_level = pages[0]->level;
  PoolGroup& below = levels_[dst_level]->pool_groups[pool_group(pages[0])];
  const auto surplus = static_cast<std::int64_t>(pages.size()) - static_cast<std::int64_t>(below.allocator.num_free());
  Borrowed<Page*> dropped_list(move_dropped_);
  std::vector<Page*>& dropped = *dropped_list;
  if (surplus > 0) {
    for (Page* p : pages) {
      if (static_cast<std::int64_t>(dropped.size()) == surplus) break;
      if (!p->holders) dropped.push_back(p);
    }
    if (static_cast<std::int64_t>(dropped.size()) < surplus)
      throw poison::corrupted("held pages fall to a level without room for them");
  }
  Borrowed<Page*> movers_list(move_movers_);
  std::vector<Page*>& movers = *movers_list;
  for (Page* p : pages) {
    if (std::find(dropped.begin(), dropped.end(), p) == dropped.end()) movers.push_back(p);
  }
  move(movers, dst_level);
  if (src_level == 0) num_evicted += movers.size();
  for (Page* page : dropped) {
    if (!page->dead()) evict_drop(page);
  }
}

void Storage::move(const std::vector<Page*>& pages, int dst_level) {
  // Bytes first (a failure leaves every page where it was), then slots, levels and queues.
  if (pages.empty()) return;
  const int src_level = pages[0]->level;
  const int pg = pool_group(pages[0]);
  PoolGroup& group = levels_[dst_level]->pool_groups[pg];
  Borrowed<std::uint64_t> slots_list(move_slots_);
  Borrowed<std::pair<std::uint64_t, std::uint64_t>> moves_list(move_pairs_);
  const std::vector<std::uint64_t>& slots = *slots_list;
  SlotMoves& moves = *moves_list;
  group.allocator.peek(pages.size(), std::nullopt, *slots_list);
  for (std::size_t i = 0; i < pages.size(); ++i) moves.emplace_back(pages[i]->slot, slots[i]);
  const std::vector<std::uint64_t> bad = transfer_.copy(*levels_[src_level], *levels_[dst_level], pg, moves);
  if (!bad.empty()) {
    std::vector<Page*> corrupt;
    for (Page* p : pages) {
      if (std::find(bad.begin(), bad.end(), p->slot) != bad.end()) corrupt.push_back(p);
    }
    forget_corrupt(corrupt);
  }
  group.allocate(pages.size(), *slots_list);  // the same slots, appended after them: not read
  for (std::size_t i = 0; i < pages.size(); ++i) {
    Page* page = pages[i];
    dequeue(page);
    free(page);
    page->level = dst_level;
    page->slot = slots[i];
    if (page->committed() && events_ != nullptr) events_->updated(page->block, page->layer_group, src_level, dst_level);
    update(page);
  }
  if (dst_level == 0) num_onboarded += pages.size();
}

void Storage::move_up(const std::vector<Page*>& pages, int dst_level) {
  for (std::size_t pg = 0; pg < pool_groups().size(); ++pg) {
    for (int lv = dst_level + 1; lv < num_levels(); ++lv) {
      std::vector<Page*> batch;
      for (Page* p : pages) {
        if (pool_group(p) == static_cast<int>(pg) && p->level == lv) batch.push_back(p);
      }
      move(batch, dst_level);
    }
  }
}

}  // namespace kvcore
