// What one request's cache holds, besides its lengths: a block per ordinal with a page per layer
// group, the commit state, and a caller's index buffer (cache_state.py). The cache's class,
// KVCache, is declared in kv_cache.h; its member functions are defined part by part in the files
// cache_state.py's docstring lists, the same cut as the Python backend's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kvcore/page.h"
#include "kvcore/per_layer_group.h"
#include "kvcore/radix_tree.h"

namespace kvcore {

enum class CacheStatus { kActive = 0, kSuspended = 1, kClosed = 2 };
enum class CommitState {
  kAllowed = 0,
  kUserStop = 1,     // stop_committing() or close(): the partial tail was committed
  kVirtualStop = 2,  // a block could not enter the tree; later tokens are only recorded
};

// (ordinal, layer group) -> priority in [0, 100]; may throw (a Python callback's error).
using PriorityCallback = std::function<int(std::int64_t, int)>;

// One block ordinal of one cache: a page per layer group (nullptr when stale or dropped).
struct CacheBlock {
  explicit CacheBlock(std::size_t num_layer_groups)
      : pages(num_layer_groups, nullptr), locked(num_layer_groups, false) {}
  PerLayerGroup<Page*> pages;
  PerLayerGroup<bool> locked;
  Block* tree_block = nullptr;  // the tree block once this block is committed
  bool copy_on_resume = false;  // pages are a reused partial block's, shared with the tree
};

// A caller's int32 buffer kept equal to one layer group's page indices. The caller owns it and
// keeps it alive until it detaches it or closes the cache.
struct IndexBuffer {
  std::int32_t* data = nullptr;
  std::size_t size = 0;
};

}  // namespace kvcore
