// Which evictable page goes first: lowest priority, then the one evictable the longest (see eviction.py).
#pragma once

#include <cstddef>
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
  struct Bucket {  // pages in release order, linked through Page::queue_prev / queue_next
    Page* head = nullptr;
    Page* tail = nullptr;
  };
  std::map<int, Bucket> buckets_;  // priority -> its pages (never empty)
  std::size_t size_ = 0;
};

}  // namespace kvcore
