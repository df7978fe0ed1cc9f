// The ghost record (ghost_record.py): a FIFO-bounded map, as a log and a flat index.
#include "kvcore/ghost_record.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "kvcore/prefetch.h"

namespace kvcore {

namespace {

std::uint32_t tag_of(const std::uint8_t* key) noexcept {
  std::uint32_t tag;
  std::memcpy(&tag, key, sizeof tag);  // SHA-256 output: any bytes are uniform
  return tag;
}

std::uint32_t tag_of(const Digest& key) noexcept { return tag_of(key.data()); }

}  // namespace

std::size_t GhostRecord::locate(const Digest& key) const noexcept {
  if (slots_.empty()) return kNone;
  const std::size_t mask = slots_.size() - 1;
  const std::uint32_t tag = tag_of(key);
  for (std::size_t i = tag & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.pos == 0) return kNone;
    if (s.tag == tag && log_[s.pos - 1].key == key) return i;
  }
}

void GhostRecord::put(Index& slots, Slot slot) noexcept {
  const std::size_t mask = slots.size() - 1;
  std::size_t i = slot.tag & mask;
  while (slots[i].pos != 0) i = (i + 1) & mask;
  slots[i] = slot;
}

void GhostRecord::place(std::size_t pos) noexcept {
  put(slots_, {tag_of(log_[pos].key), static_cast<std::uint32_t>(pos + 1)});
}

void GhostRecord::erase_slot(std::size_t slot) noexcept {
  // Backward shift: a later slot of the run whose home is not within (slot, j] moves up.
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t j = (slot + 1) & mask; slots_[j].pos != 0; j = (j + 1) & mask) {
    const std::size_t home = slots_[j].tag & mask;
    const bool between = slot <= j ? (slot < home && home <= j) : (slot < home || home <= j);
    if (!between) {
      slots_[slot] = slots_[j];
      slot = j;
    }
  }
  slots_[slot] = {0, 0};
}

void GhostRecord::reindex() noexcept {
  std::fill(slots_.begin(), slots_.end(), Slot{0, 0});
  for (std::size_t pos = head_; pos < log_.size(); ++pos) {
    if (log_[pos].live) place(pos);
  }
}

void GhostRecord::grow() {
  // Swept in the old index's order: an entry's home in the doubled index is its old home or that
  // plus the old size, so the writes run in two streams. Placing each entry afresh from the log
  // was a random write each (2.9 million, doublings and compactions, in a Mooncake replay).
  Index grown(std::max<std::size_t>(64, 2 * slots_.size()), Slot{0, 0});
  for (const Slot& slot : slots_) {
    if (slot.pos != 0) put(grown, slot);
  }
  slots_.swap(grown);
}

void GhostRecord::grow_log() {
  // Room for every entry the log can hold, at its first growth: the address space is taken, its
  // pages only as entries are written. Doubling copied the log at every growth into pages never
  // touched before, twice the memory faulted in (64 ms of a Mooncake replay's 1.8 s in the kernel).
  if (log_.empty()) {
    const auto most = static_cast<std::size_t>(capacity_) + static_cast<std::size_t>(capacity_) / 2 + 1025;
    try {
      log_.reserve(std::min(most, kFirstRoom));
      return;
    } catch (const std::bad_alloc&) {
      // Not that much address space: double as it fills.
    }
  }
  log_.reserve(std::max<std::size_t>(64, 2 * log_.size()));
}

void GhostRecord::compact() noexcept {
  // Live entries keep their order; the index's positions are then renumbered in one sweep (a
  // reindex where there is no memory for the numbering).
  std::unique_ptr<std::uint32_t[]> renumbered(new (std::nothrow) std::uint32_t[log_.size()]);
  std::size_t out = 0;
  for (std::size_t pos = head_; pos < log_.size(); ++pos) {
    if (!log_[pos].live) continue;
    if (renumbered) renumbered[pos] = static_cast<std::uint32_t>(out);
    log_[out++] = log_[pos];
  }
  log_.resize(out);  // shrinks: allocates nothing
  head_ = 0;
  if (!renumbered) {
    reindex();
    return;
  }
  for (Slot& slot : slots_) {  // only live entries have slots, all at or past head_
    if (slot.pos != 0) slot.pos = renumbered[slot.pos - 1] + 1;
  }
}

void GhostRecord::record(const Digest& key, int level) {
  if (capacity_ == 0) return;
  // Room first (what may throw), then the changes.
  if (2 * (live_ + 1) > slots_.size()) grow();
  if (log_.size() == log_.capacity()) grow_log();
  forget(key);  // recorded again: it is the newest now
  if (static_cast<std::int64_t>(live_) == capacity_) {
    while (!log_[head_].live) ++head_;
    forget(log_[head_].key);
    // A full record forgets its oldest entry at every record: that entry's slot, anywhere in
    // the index, is asked for some records ahead (the log's lines come in order).
    if (head_ + kForgetAhead < log_.size()) prefetch(log_[head_ + kForgetAhead].key.data());
  }
  log_.push_back({key, clock_, level, true});  // within the capacity: cannot throw
  place(log_.size() - 1);
  ++live_;
  if (log_.size() - live_ > live_ / 2 + 1024) compact();
}

void GhostRecord::forget(const Digest& key) noexcept {
  const std::size_t slot = locate(key);
  if (slot == kNone) return;
  log_[slots_[slot].pos - 1].live = false;
  erase_slot(slot);
  --live_;
}

void GhostRecord::prefetch(const std::uint8_t* key) const noexcept {
  if (!slots_.empty()) kvcore::prefetch(&slots_[tag_of(key) & (slots_.size() - 1)]);
}

std::optional<EvictedBlock> GhostRecord::find(const Digest& key) const {
  const std::size_t slot = locate(key);
  if (slot == kNone) return std::nullopt;
  const Entry& entry = log_[slots_[slot].pos - 1];
  return EvictedBlock{entry.level, clock_ - entry.clock};
}

}  // namespace kvcore
