#include "kvcore/storage.h"

#include <string>

#include "kvcore/error.h"

namespace kvcore {

PoolGroup::PoolGroup(int index, const std::vector<std::uint64_t>& slot_sizes, std::uint64_t num_slots)
    : index(index), allocator(num_slots) {
  pools.reserve(slot_sizes.size());
  for (std::uint64_t size : slot_sizes) pools.emplace_back(num_slots, size);
}

double PoolGroup::utilization() const {
  const StorageStatistics s = statistics();
  return static_cast<double>(s.total - s.free - s.evictable) / static_cast<double>(s.total);
}

Storage::Storage(const StorageConfig& config, const SlotCounts& counts, const LifeCycleRegistry& registry,
                 RadixTree& tree, KVCacheEventManager* events)
    : config_(config), registry_(registry), tree_(tree), events_(events) {
  for (const PoolGroupConfig& pg : config.pool_groups())
    pool_groups_.emplace_back(pg.index, pg.slot_sizes, counts.slots[pg.index]);
}

std::vector<StorageStatistics> Storage::statistics() const {
  std::vector<StorageStatistics> out;
  for (const PoolGroup& pg : pool_groups_) out.push_back(pg.statistics());
  return out;
}

std::vector<Page*> Storage::new_pages(const std::vector<std::pair<int, int>>& requests) {
  std::vector<std::uint64_t> need(pool_groups_.size(), 0);
  for (const auto& r : requests) ++need[config_.pool_group_of(r.first)];
  for (PoolGroup& pg : pool_groups_) {
    const std::uint64_t n = need[pg.index];
    if (n > pg.allocator.num_free() + pg.evictable.size()) {
      throw Error(ErrorKind::kOutOfPages, "pool group " + std::to_string(pg.index) + ": need " + std::to_string(n) +
                                              " slots, " + std::to_string(pg.allocator.num_free()) + " free and " +
                                              std::to_string(pg.evictable.size()) + " evictable");
    }
  }
  std::vector<std::vector<std::uint64_t>> slots;
  for (PoolGroup& pg : pool_groups_) {
    const std::uint64_t n = need[pg.index];
    while (pg.allocator.num_free() < n) {
      drop(pg.evictable.pop());
      ++num_evicted;
    }
    slots.push_back(pg.allocator.allocate(n));
  }
  std::vector<std::size_t> next(pool_groups_.size(), 0);
  std::vector<Page*> pages;
  for (const auto& [lc, priority] : requests) {
    const int p = config_.pool_group_of(lc);
    const std::uint64_t slot = slots[p][next[p]++];
    std::deque<Page>& by_slot = pool_groups_[p].pages;
    while (by_slot.size() <= slot) by_slot.emplace_back();  // fresh slots come in order: one at a time
    Page& page = by_slot[slot];
    page = Page{};
    page.slot = slot;
    page.life_cycle = lc;
    page.pool_group = p;
    page.priority = priority;
    pages.push_back(&page);
  }
  return pages;
}

void Storage::copy(const Page* src, const Page* dst) {
  for (MemoryPool& pool : pool_groups_[src->pool_group].pools) pool.copy_slot(src->slot, dst->slot);
}

void Storage::free(Page* page) { pool_groups_[page->pool_group].allocator.release(page->slot); }

void Storage::hold(Page* page) {
  if (page->holders == 0 && page->committed()) pool_groups_[page->pool_group].evictable.remove(page);
  ++page->holders;
}

void Storage::unhold(Page* page) {
  if (--page->holders) return;
  if (page->committed()) {
    pool_groups_[page->pool_group].evictable.push(page);
  } else {
    free(page);
  }
}

void Storage::adopt(Block* block, Block* sibling) {
  // The block takes the sibling's pages with their coverage, so the shorter endpoint stays
  // reusable; the sibling leaves the tree (Removed). A page a cache holds leaves with it: that
  // cache (the sibling's writer, or a reader yet to copy it) holds none of the block's other
  // pages, so evicting those would take the block from under it.
  for (int lc = 0; lc < static_cast<int>(sibling->pages.size()); ++lc) {
    Page* page = sibling->pages[lc];
    if (page == nullptr) continue;
    sibling->pages[lc] = nullptr;
    if (events_) events_->removed(sibling, lc);
    if (page->holders) {
      orphan(page);
    } else {
      page->block = block;
      block->pages[lc] = page;
    }
  }
  tree_.detach(sibling);  // destroys it
}

void Storage::orphan(Page* page) {
  page->block = nullptr;
  if (!page->holders) {
    pool_groups_[page->pool_group].evictable.remove(page);
    free(page);
  }
}

void Storage::drop(Page* page) {
  // Losing a full-attention or sink page makes every later block unusable, so the block's
  // whole subtree goes; a window page goes alone. Then empty, page-less ancestors are pruned.
  Block* block = page->block;
  const int lc = page->life_cycle;
  discard(block, lc);
  const LifeCycle& life = registry_.life_cycles()[lc];
  if (!life.window || block->ordinal < life.num_sink_blocks) {
    for (Block* b : RadixTree::subtree(block)) {
      for (int l = 0; l < static_cast<int>(b->pages.size()); ++l) {
        Page* p = b->pages[l];
        if (p == nullptr) continue;
        if (p->holders) {
          throw Error(ErrorKind::kCorrupted, "held page in a removed subtree (block " + std::to_string(b->ordinal) +
                                                 ", life cycle " + std::to_string(l) + ")");
        }
        pool_groups_[p->pool_group].evictable.remove(p);
        discard(b, l);
      }
    }
    Node* parent = block->parent;
    tree_.detach(block);  // destroys the subtree
    tree_.prune(parent);
  } else {
    tree_.prune(block);
  }
}

void Storage::discard(Block* block, int life_cycle) {
  Page* page = block->pages[life_cycle];
  block->pages[life_cycle] = nullptr;
  page->block = nullptr;
  free(page);
  if (events_) events_->removed(block, life_cycle);
}

void Storage::clear() {
  for (Root* root : std::vector<Root*>(tree_.roots())) {
    for (Block* child : std::vector<Block*>(root->children())) {
      for (Block* b : RadixTree::subtree(child)) {
        for (int l = 0; l < static_cast<int>(b->pages.size()); ++l) {
          Page* p = b->pages[l];
          if (p == nullptr) continue;
          pool_groups_[p->pool_group].evictable.remove(p);
          discard(b, l);
        }
      }
    }
  }
  tree_.clear();
}

}  // namespace kvcore
