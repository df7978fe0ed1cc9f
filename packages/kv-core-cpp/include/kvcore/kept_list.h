// A list an object keeps between calls (emptied, its memory kept), so that a hot path allocates
// nothing once the list has grown: glibc, in a heap grown through millions of blocks, hands out
// its coldest small chunks first (docs/performance.md, "the decode step's growth was the
// allocator's"). A call made while the list is in use (a page copier calling back into the
// manager) gets a list of its own. Its owner's lock (the manager's).
#pragma once

#include <vector>

namespace kvcore {

template <typename T>
struct KeptList {
  std::vector<T> list;
  bool busy = false;
};

// The kept list for as long as this lives, emptied unless `keep_items` (a list of lists whose
// items keep their own memory, emptied one by one); a fresh one where it is busy.
template <typename T>
class Borrowed {
 public:
  explicit Borrowed(KeptList<T>& kept, bool keep_items = false)
      : busy_(kept.busy), was_(kept.busy), list_(kept.busy ? own_ : kept.list) {
    busy_ = true;
    if (!keep_items) list_.clear();
  }
  ~Borrowed() { busy_ = was_; }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  std::vector<T>& operator*() noexcept { return list_; }

 private:
  bool& busy_;
  bool was_;
  std::vector<T> own_;
  std::vector<T>& list_;
};

}  // namespace kvcore
