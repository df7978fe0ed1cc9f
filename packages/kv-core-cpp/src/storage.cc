#include "kvcore/storage.h"

#include <algorithm>
#include <string>

#include "kvcore/poison.h"

namespace kvcore {

Storage::Storage(const KVCacheManagerConfig& manager_config, const StorageConfig& config,
                 const LifeCycleRegistry& registry, RadixTree& tree, KVCacheEventManager* events, PageCopier* copier)
    : config_(config), registry_(registry), tree_(tree), events_(events), transfer_(levels_, copier) {
  for (int level = 0; level < static_cast<int>(manager_config.cache_tiers.size()); ++level)
    levels_.push_back(std::make_unique<CacheLevel>(level, manager_config, registry, config));
}

std::vector<StorageStatistics> Storage::statistics(int level) const { return levels_[level]->statistics(); }

void Storage::close() {
  for (auto& level : levels_) level->close();
}

Page* Storage::new_record() {
  Page* page;
  if (free_records_.empty()) {
    page = &records_.emplace_back();
  } else {
    page = free_records_.back();
    free_records_.pop_back();
    const std::uint64_t generation = page->generation;
    *page = Page{};
    page->generation = generation;
  }
  return page;
}

void Storage::retire(Page* page) {
  ++page->generation;
  if (page->planned) {  // its handles know it by the old generation: they skip it
    planned_.erase(page);
    page->planned = 0;
  }
  if (guards_) {
    retired_.push_back(page);
  } else {
    free_records_.push_back(page);
  }
}

void Storage::plan_drop(Page* page) {
  ++planned_[page];
  page->planned = 1;
}

bool Storage::unplan_drop(Page* page) noexcept {
  const auto it = planned_.find(page);
  if (it == planned_.end()) return false;  // not planned: nothing to count down
  if (--it->second > 0) return false;
  planned_.erase(it);
  page->planned = 0;
  return true;
}

void Storage::recycle() {
  free_records_.insert(free_records_.end(), retired_.begin(), retired_.end());
  retired_.clear();
}

// -- page status ------------------------------------------------------------------------------

bool Storage::evictable(const Page* page) const {
  if (page->locks) return false;
  if (page->holders) return page->level < last_level();
  return page->committed();
}

void Storage::update(Page* page) {
  const bool should = evictable(page);
  if (page->queued == should) return;
  EvictionQueue& queue = pool_group_of(page).evictable;
  if (should) {
    queue.push(page);
  } else {
    queue.remove(page);
  }
}

void Storage::dequeue(Page* page) {
  if (page->queued) pool_group_of(page).evictable.remove(page);
}

void Storage::hold(Page* page, std::optional<int> priority) {
  if (priority && *priority > page->priority) {
    dequeue(page);
    page->priority = *priority;
  }
  ++page->holders;
  update(page);
}

void Storage::unhold(Page* page) {
  --page->holders;
  if (page->holders || page->committed()) {
    update(page);
  } else {
    dequeue(page);
    free(page);
    retire(page);
  }
}

void Storage::lock(Page* page) {
  if (page->level != 0) throw poison::corrupted("locking a page at cache level " + std::to_string(page->level));
  ++page->locks;
  update(page);
}

void Storage::unlock(Page* page) {
  --page->locks;
  update(page);
}

void Storage::free(Page* page) { pool_group_of(page).allocator.release(page->slot); }

// -- new pages and copies ----------------------------------------------------------------------

std::vector<Page*> Storage::new_pages(const std::vector<std::pair<int, int>>& requests) {
  std::vector<Page*> pages;
  new_pages(requests, pages);
  return pages;
}

void Storage::new_pages(const std::vector<std::pair<int, int>>& requests, std::vector<Page*>& out) {
  Borrowed<std::uint64_t> need(new_need_);
  Borrowed<std::uint64_t> slots(new_slots_);
  Borrowed<std::size_t> first(new_first_);
  (*need).assign(pool_groups().size(), 0);
  for (const auto& r : requests) ++(*need)[config_.pool_group_of(r.first)];
  make_room(0, *need);
  for (PoolGroup& pg : pool_groups()) {
    (*first).push_back((*slots).size());
    pg.allocate((*need)[pg.index], *slots);
  }
  out.clear();
  for (const auto& [layer_group, priority] : requests) {
    const int p = config_.pool_group_of(layer_group);
    Page* page = new_record();
    page->slot = (*slots)[(*first)[p]++];
    page->layer_group = layer_group;
    page->priority = priority;
    out.push_back(page);
  }
}

Page* Storage::new_page_at(int level, int layer_group, std::uint64_t slot, int priority) {
  Page* page = new_record();
  page->slot = slot;
  page->level = level;
  page->layer_group = layer_group;
  page->priority = priority;
  return page;
}

void Storage::free_new(Page* page) {
  free(page);
  retire(page);
}

void Storage::copy(Page* src, const Page* dst) {
  if (!transfer_.copy(level(src->level), level(dst->level), pool_group(src), {{src->slot, dst->slot}}).empty())
    forget_corrupt({src});
}

// -- quota resize ----------------------------------------------------------------------------------

void Storage::resize_level(int level, const SlotCounts& counts, const std::vector<Page*>& live) {
  std::deque<PoolGroup>& groups = levels_[level]->pool_groups;
  const std::vector<std::uint64_t>& target = counts.slots;
  std::vector<std::vector<MemoryPool>> memory;
  std::vector<std::uint64_t> need;
  for (PoolGroup& g : groups) {
    const std::uint64_t n = target[g.index];
    memory.push_back(n != g.num_slots() ? g.new_memory(n) : std::vector<MemoryPool>{});
    need.push_back(g.num_slots() > n ? g.num_slots() - n : 0);
  }
  make_room(level, need);
  for (PoolGroup& group : groups) {
    const std::uint64_t n = target[group.index];
    if (n == group.num_slots()) continue;
    std::vector<Page*> mine;
    for (Page* p : live) {
      if (!p->dead() && p->level == level && pool_group(p) == group.index) mine.push_back(p);
    }
    std::sort(mine.begin(), mine.end(), [](const Page* a, const Page* b) { return a->slot < b->slot; });
    std::vector<Page*> movers;
    for (Page* p : mine) {
      if (p->slot >= n) movers.push_back(p);
    }
    const std::vector<std::uint64_t> slots = group.allocator.peek(movers.size(), n);
    SlotMoves moves;
    for (std::size_t i = 0; i < movers.size(); ++i) moves.emplace_back(movers[i]->slot, slots[i]);
    // A corrupt page moves with its bytes, still failing its checksum: found when read up.
    transfer_.copy(*levels_[level], *levels_[level], group.index, moves);
    group.allocator.resize(n);
    group.allocate(movers.size());
    for (std::size_t i = 0; i < movers.size(); ++i) movers[i]->slot = slots[i];
    std::vector<std::uint64_t> occupied;
    for (const Page* p : mine) occupied.push_back(p->slot);
    std::sort(occupied.begin(), occupied.end());
    group.remap(n, std::move(memory[group.index]), occupied);
  }
  levels_[level]->counts = counts;
}

// -- the tree's pages ----------------------------------------------------------------------------

void Storage::adopt(Block* block, Block* sibling) {
  // The block takes the sibling's pages with their coverage, so the shorter endpoint stays
  // reusable; the sibling leaves the tree (Removed). A page a cache holds leaves with it: that
  // cache (the sibling's writer, or a reader yet to copy it) holds none of the block's other
  // pages, so evicting those would take the block from under it.
  for (int layer_group = 0; layer_group < static_cast<int>(sibling->pages.size()); ++layer_group) {
    Page* page = sibling->pages[layer_group];
    if (page == nullptr) continue;
    sibling->pages[layer_group] = nullptr;
    if (events_) events_->removed(sibling, layer_group);
    if (page->holders) {
      orphan(page);
    } else {
      page->block = block;
      block->pages[layer_group] = page;
    }
  }
  tree_.recycle(tree_.detach(sibling));
}

void Storage::replace(Block* block, int layer_group, Page* page) {
  Page* old = block->pages[layer_group];
  page->block = block;
  page->num_tokens = old->num_tokens;
  block->pages[layer_group] = page;
  const int old_level = old->level;
  orphan(old);
  update(page);
  if (events_ && old_level != page->level) events_->updated(block, layer_group, old_level, page->level);
}

void Storage::orphan(Page* page) {
  page->block = nullptr;
  if (!page->holders) {
    dequeue(page);
    free(page);
    retire(page);
  } else {
    update(page);
  }
}

void Storage::drop(Page* page) {
  // Losing a full-attention or sink page makes every later block unusable, so the block's
  // whole subtree goes; a window page or an SSM snapshot goes alone. Then empty, page-less ancestors are pruned.
  Block* block = page->block;
  const int layer_group = page->layer_group;
  const int level = page->level;  // where the blocks leaving the tree fell from (the ghost record's)
  discard(block, layer_group);
  if (registry_.kind(layer_group).drop_takes_subtree(block->ordinal)) {
    const auto release = [this](Block* b) {
      if (b->pins) {
        throw poison::corrupted("a pinned block in a removed subtree (block " + std::to_string(b->ordinal) + ")");
      }
      for (int layer_group = 0; layer_group < static_cast<int>(b->pages.size()); ++layer_group) {
        Page* p = b->pages[layer_group];
        if (p == nullptr) continue;
        if (p->holders) {
          throw poison::corrupted("held page in a removed subtree (block " + std::to_string(b->ordinal) +
                                  ", life cycle " + std::to_string(layer_group) + ")");
        }
        dequeue(p);
        discard(b, layer_group);
      }
    };
    // A leaf is the usual case (a closed request's pages are evicted last block first): no
    // subtree list to build for it.
    if (block->children().empty()) {
      release(block);
    } else {
      for (Block* b : RadixTree::subtree(block)) release(b);
    }
    Node* parent = block->parent;
    tree_.recycle(tree_.detach(block, level));  // the whole subtree
    tree_.prune(parent, level);
  } else {
    tree_.prune(block, level);
  }
}

void Storage::drop_now(Page* page) {
  // A planned drop: as an eviction would drop the page, but not counted as one.
  dequeue(page);
  drop(page);
}

void Storage::discard(Block* block, int layer_group) {
  Page* page = block->pages[layer_group];
  block->pages[layer_group] = nullptr;
  page->block = nullptr;
  free(page);
  retire(page);
  if (events_) events_->removed(block, layer_group);
}

void Storage::clear() {
  for (Root* root : std::vector<Root*>(tree_.roots())) {
    const ChildList& children = root->children();
    for (Block* child : std::vector<Block*>(children.begin(), children.end())) {
      for (Block* b : RadixTree::subtree(child)) {
        for (int layer_group = 0; layer_group < static_cast<int>(b->pages.size()); ++layer_group) {
          Page* p = b->pages[layer_group];
          if (p == nullptr) continue;
          dequeue(p);
          discard(b, layer_group);
        }
      }
    }
  }
  tree_.clear();
}

}  // namespace kvcore
