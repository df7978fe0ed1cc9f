// The ghost record (ghost_record.py): a FIFO-bounded map, linked through its own nodes.
#include "kvcore/ghost_record.h"

namespace kvcore {

void GhostRecord::unlink(Entry& entry) noexcept {
  (entry.older != nullptr ? entry.older->newer : oldest_) = entry.newer;
  (entry.newer != nullptr ? entry.newer->older : newest_) = entry.older;
}

void GhostRecord::record(const Digest& key, int level) {
  if (capacity_ == 0) return;
  forget(key);  // recorded again: it is the newest now
  if (static_cast<std::int64_t>(entries_.size()) == capacity_) {
    const Digest oldest = *oldest_->key;  // a copy: erase must not read the node it frees
    forget(oldest);
  }
  const auto it = entries_.emplace(key, Entry{level, clock_, nullptr, newest_, nullptr}).first;
  Entry& entry = it->second;
  entry.key = &it->first;
  (newest_ != nullptr ? newest_->newer : oldest_) = &entry;
  newest_ = &entry;
}

void GhostRecord::forget(const Digest& key) noexcept {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return;
  unlink(it->second);
  entries_.erase(it);
}

std::optional<EvictedBlock> GhostRecord::find(const Digest& key) const {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return EvictedBlock{it->second.level, clock_ - it->second.clock};
}

}  // namespace kvcore
