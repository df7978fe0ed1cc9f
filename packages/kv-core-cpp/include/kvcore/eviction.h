// Which evictable page goes first: lowest priority, then the one evictable the longest; mirrors
// eviction.py.
//
// One (level, pool group)'s queue, owned by its PoolGroup. It links the pages it holds through
// their queue_prev / queue_next and owns none (they are Storage's records). A page is in at most
// one queue, and its priority must not change while it is queued (Storage::hold dequeues it
// first): remove() finds its bucket by it. Every member REQUIRES: the manager's lock (the thread
// rule: docs/architecture.md, Threads).
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "kvcore/page.h"
#include "kvcore/page_set.h"

namespace kvcore {

class EvictionQueue {
 public:
  std::size_t size() const { return size_; }
  void push(Page* page);
  void remove(Page* page);
  // The first `n` pages (fewer if there are not so many) in eviction order, skipping the queued
  // ones in `exclude`, as if `pending` were pushed first (in order): each priority's queued pages,
  // then its pending ones. Into `out` (cleared first).
  void candidates(std::size_t n, const PageSet& exclude, const std::vector<Page*>& pending,
                  std::vector<Page*>& out) const;

 private:
  struct Bucket {  // pages in release order, linked through Page::queue_prev / queue_next
    Page* head = nullptr;
    Page* tail = nullptr;
  };
  std::map<int, Bucket> buckets_;  // priority -> its pages (never empty)
  std::size_t size_ = 0;
};

}  // namespace kvcore
