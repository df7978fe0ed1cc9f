// Which evictable page goes first: lowest priority, then the one evictable the longest (see eviction.py).
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <unordered_set>
#include <vector>

#include "kvcore/page.h"

namespace kvcore {

class EvictionQueue {
 public:
  std::size_t size() const { return size_; }
  void push(Page* page);
  void remove(Page* page);
  // The first `n` pages (fewer if there are not so many) in eviction order, skipping `exclude`,
  // as if `pending` were pushed first (in order): each priority's queued pages, then its pending ones.
  std::vector<Page*> candidates(std::size_t n, const std::unordered_set<const Page*>& exclude,
                                const std::vector<Page*>& pending) const;

 private:
  std::map<int, std::list<Page*>> buckets_;  // priority -> pages in release order
  std::size_t size_ = 0;
};

}  // namespace kvcore
