// A cache's page indices (page_indices.py): per layer group the slot of each block's locked page,
// the levels of its pages, and the caller's buffers kept equal to them.
#include <algorithm>
#include <string>

#include "kvcore/cache_context.h"
#include "kvcore/constants.h"
#include "kvcore/error.h"
#include "kvcore/kv_cache.h"

namespace kvcore {

std::vector<std::int32_t> KVCache::get_base_page_indices(int layer_group) const {
  const auto lock = context_.lock();
  return index_[layer_group];
}

std::int32_t KVCache::get_ssm_block_base_index(int layer_group) const {
  const auto lock = context_.lock();
  const Page* state = ssm_state_[layer_group];
  return state != nullptr && ssm_locked_[layer_group] ? static_cast<std::int32_t>(state->slot) : kBadPageIndex;
}

std::vector<std::int32_t> KVCache::get_page_levels(int layer_group) const {
  const auto lock = context_.lock();
  std::vector<std::int32_t> out;
  out.reserve(blocks_.size());
  for (const CacheBlock& cache_block : blocks_) {
    const Page* page = cache_block.pages[layer_group];
    out.push_back(page ? page->level : -1);
  }
  return out;
}

void KVCache::set_base_page_index_buf(int layer_group, IndexBuffer buffer) {
  const auto lock = context_.lock();  // resize and close write through the buffers it changes
  if (buffer.data == nullptr) {
    user_buffers_.erase(layer_group);
    return;
  }
  if (static_cast<std::int64_t>(buffer.size) < num_blocks()) {
    throw Error(ErrorKind::kValue,
                "buf: too short (" + std::to_string(buffer.size) + " < " + std::to_string(num_blocks()) + " blocks)");
  }
  user_buffers_[layer_group] = buffer;
  sync_user_buffers();
}

void KVCache::sync_user_buffers() {
  for (auto& [group, buf] : user_buffers_) {
    const std::vector<std::int32_t>& index = index_[group];
    std::copy(index.begin(), index.end(), buf.data);
    std::fill(buf.data + index.size(), buf.data + buf.size, kBadPageIndex);
  }
}

}  // namespace kvcore
