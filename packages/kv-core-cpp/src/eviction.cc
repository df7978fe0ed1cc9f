#include "kvcore/eviction.h"

namespace kvcore {

void EvictionQueue::push(Page* page) {
  Bucket& bucket = buckets_[page->priority];
  page->queue_prev = bucket.tail;
  page->queue_next = nullptr;
  (bucket.tail != nullptr ? bucket.tail->queue_next : bucket.head) = page;
  bucket.tail = page;
  page->queued = true;
  ++size_;
}

void EvictionQueue::remove(Page* page) {
  auto it = buckets_.find(page->priority);
  Bucket& bucket = it->second;
  (page->queue_prev != nullptr ? page->queue_prev->queue_next : bucket.head) = page->queue_next;
  (page->queue_next != nullptr ? page->queue_next->queue_prev : bucket.tail) = page->queue_prev;
  page->queue_prev = page->queue_next = nullptr;
  if (bucket.head == nullptr) buckets_.erase(it);
  page->queued = false;
  --size_;
}

void EvictionQueue::candidates(std::size_t n, const PageSet& exclude, const std::vector<Page*>& pending,
                               std::vector<Page*>& out) const {
  std::map<int, std::vector<Page*>> later;  // empty (no allocation) without pending pages
  for (Page* page : pending) later[page->priority].push_back(page);
  out.clear();
  auto queued = buckets_.begin();
  auto pend = later.begin();
  while (out.size() < n && (queued != buckets_.end() || pend != later.end())) {
    int priority;
    if (pend == later.end() || (queued != buckets_.end() && queued->first <= pend->first)) {
      priority = queued->first;
    } else {
      priority = pend->first;
    }
    if (queued != buckets_.end() && queued->first == priority) {
      for (Page* page = queued->second.head; page != nullptr; page = page->queue_next) {
        if (out.size() == n) break;
        if (exclude.empty() || !exclude.contains(page)) out.push_back(page);
      }
      ++queued;
    }
    if (pend != later.end() && pend->first == priority) {
      for (Page* page : pend->second) {
        if (out.size() == n) break;
        out.push_back(page);
      }
      ++pend;
    }
  }
}

}  // namespace kvcore
