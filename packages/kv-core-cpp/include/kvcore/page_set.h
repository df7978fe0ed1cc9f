// The pages a make_room must not evict (a resuming cache's own, a remote fetch's match): the
// caller's list, sorted in place and searched by bisection. A hash set cost an allocation per
// page, and a resume from the host keeps hundreds, each a small chunk that glibc serves cold in
// a heap of millions of blocks (docs/performance.md, "Cost as the cache grows"). No state of
// its own beyond the view: the list must outlive the set.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "kvcore/page.h"

namespace kvcore {

class PageSet {
 public:
  PageSet() = default;
  explicit PageSet(std::vector<const Page*>& pages) noexcept
      : first_(pages.data()), last_(pages.data() + pages.size()) {
    std::sort(first_, last_, std::less<const Page*>());
  }

  bool empty() const noexcept { return first_ == last_; }
  bool contains(const Page* page) const noexcept {
    return std::binary_search(first_, last_, page, std::less<const Page*>());
  }

 private:
  const Page** first_ = nullptr;
  const Page** last_ = nullptr;
};

}  // namespace kvcore
