// Which committed droppable page goes first: lowest priority, least recently released.
#pragma once

#include <cstddef>
#include <list>
#include <map>

#include "kvcore/page.h"

namespace kvcore {

class EvictionQueue {
 public:
  std::size_t size() const { return size_; }
  void push(Page* page);
  void remove(Page* page);
  Page* pop();

 private:
  std::map<int, std::list<Page*>> buckets_;  // priority -> pages in release order
  std::size_t size_ = 0;
};

}  // namespace kvcore
