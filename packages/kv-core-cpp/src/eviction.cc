#include "kvcore/eviction.h"

namespace kvcore {

void EvictionQueue::push(Page* page) {
  auto& bucket = buckets_[page->priority];
  page->queue_pos = bucket.insert(bucket.end(), page);
  ++size_;
}

void EvictionQueue::remove(Page* page) {
  auto it = buckets_.find(page->priority);
  it->second.erase(page->queue_pos);
  if (it->second.empty()) buckets_.erase(it);
  --size_;
}

Page* EvictionQueue::pop() {
  auto it = buckets_.begin();
  Page* page = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) buckets_.erase(it);
  --size_;
  return page;
}

}  // namespace kvcore
