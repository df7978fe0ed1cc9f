#include "kvcore/radix_tree.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "kvcore/constants.h"
#include "kvcore/ghost_record.h"
#include "kvcore/huge_pages.h"
#include "kvcore/scope_free_index.h"

namespace kvcore {

bool Block::has_pages() const {
  return std::any_of(pages.begin(), pages.end(), [](const Page* p) { return p != nullptr; });
}

namespace {

// Blocks hashed ahead while walking: a few first (most prompts miss early: a cold prompt's first
// block), doubling up to kKeyBatch while they keep matching.
constexpr std::size_t kFirstKeyBatch = 4;
constexpr std::size_t kKeyBatch = 64;

template <typename A, typename B>
bool is_proper_prefix(const A& a, const B& b) {
  if (a.size() >= b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same_token(a, i, b, i)) return false;
  }
  return true;
}

}  // namespace

std::int64_t common_prefix(const BlockTokens& a, const Tokens& b, std::size_t b_begin, std::size_t b_end) {
  const std::size_t n = std::min(a.size(), b_end - b_begin);
  for (std::size_t i = 0; i < n; ++i) {
    if (!same_token(a, i, b, b_begin + i)) return static_cast<std::int64_t>(i);
  }
  return static_cast<std::int64_t>(n);
}

namespace {

// A block's token area holds a full block's 4-byte ids up to this many bytes; a longer block's
// ids go to the heap (block_tokens.h), so that a tree of huge blocks does not reserve megabytes
// for each partial one.
constexpr std::size_t kMaxTokenArea = 1024;
// Arena chunks: the first 64 KiB, each next one twice the last up to 2 MiB, from there mapped
// on their own and advised as huge pages: a tree of millions of blocks is walked at random, and
// with 4 KiB pages nearly every step was a TLB miss.
constexpr std::size_t kFirstChunkBytes = std::size_t{64} << 10;
constexpr std::size_t kHugeChunkBytes = kHugePageBytes;

}  // namespace

RadixTree::RadixTree(std::size_t num_layer_groups, std::int64_t tokens_per_block)
    : num_layer_groups_(num_layer_groups),
      tokens_per_block_(tokens_per_block),
      area_bytes_(std::max<std::size_t>(
          8, (std::min(4 * static_cast<std::size_t>(tokens_per_block), kMaxTokenArea) + 7) / 8 * 8)),
      slot_bytes_(sizeof(Block) + area_bytes_) {}

RadixTree::~RadixTree() {  // here, where GhostRecord and ScopeFreeIndex are complete
  on_remove = nullptr;     // nobody to tell: the manager is going
  destroy_blocks();
}

Block* RadixTree::new_block(const Digest& key, Node* parent, std::int64_t ordinal) {
#if defined(__SANITIZE_ADDRESS__)
  void* slot = ::operator new(slot_bytes_);
  try {
    return new (slot) Block(key, parent, ordinal, num_layer_groups_);
  } catch (...) {
    ::operator delete(slot);
    throw;
  }
#else
  if (spare_ != nullptr) {
    Block* block = spare_;
    spare_ = static_cast<Block*>(block->parent);
    block->key = key;
    block->parent = parent;
    block->ordinal = ordinal;
    block->pins = 0;
    std::fill(block->pages.begin(), block->pages.end(), nullptr);
    return block;
  }
  if (used_in_chunk_ == slots_in_chunk_) add_chunk();
  void* slot = chunks_.back().first + used_in_chunk_ * slot_bytes_;
  Block* block = new (slot) Block(key, parent, ordinal, num_layer_groups_);  // may throw: the slot stays free
  ++used_in_chunk_;
  return block;
#endif
}

void RadixTree::free_block(Block* block) noexcept {
  if (on_remove) on_remove(block);
  release_tokens(block->area(), block->header());
  block->token_size_ = block->tokens_wide_ = block->tokens_digests_ = block->tokens_heap_ = 0;
#if defined(__SANITIZE_ADDRESS__)
  block->~Block();
  ::operator delete(block);
#else
  block->parent = spare_;
  spare_ = block;
#endif
}

void RadixTree::destroy_blocks() noexcept {
  // Every block to the spare list (recycle(): no recursion, a long prompt is a chain of
  // thousands), then every spare destroyed (its child and page storage freed) and the arena freed.
  for (const auto& [key, root] : roots_) {
    while (!root->children().empty()) {
      Block* block = root->children().back();
      root->order_.remove(block);
      recycle(block);
    }
  }
  while (spare_ != nullptr) {
    Block* block = spare_;
    spare_ = static_cast<Block*>(block->parent);
    block->~Block();
  }
  for (const auto& [data, bytes] : chunks_) {
    if (bytes >= kHugeChunkBytes) {
      unmap_huge(data, bytes);
    } else {
      delete[] data;
    }
  }
  chunks_.clear();
  used_in_chunk_ = slots_in_chunk_ = 0;
}

void RadixTree::add_chunk() {
  std::size_t bytes = std::min(kFirstChunkBytes << std::min<std::size_t>(chunks_.size(), 8), kHugeChunkBytes);
  bytes = std::max(bytes, slot_bytes_);  // a block of a huge token area still fits
  chunks_.reserve(chunks_.size() + 1);   // so that the push below cannot throw
  std::uint8_t* data = bytes == kHugeChunkBytes ? static_cast<std::uint8_t*>(map_huge(bytes)) : new std::uint8_t[bytes];
  chunks_.emplace_back(data, bytes);
  used_in_chunk_ = 0;
  slots_in_chunk_ = bytes / slot_bytes_;
}

MatchPath RadixTree::walk(const Digest& root_key, const Tokens& tokens, std::int64_t tokens_per_block, KeyFormat format,
                          bool partial) const {
  MatchPath path;
  const Node* node = find_root(root_key);
  if (node == nullptr) return path;
  const auto tokens_per_block_unsigned = static_cast<std::size_t>(tokens_per_block);
  const std::size_t blocks = ceil_div(tokens.count, tokens_per_block_unsigned);
  std::vector<std::uint8_t> keys(32 * (kKeyBatch + 1));
  std::size_t batch_first = 0, batch_count = 0, batch_size = kFirstKeyBatch;
  for (std::size_t b = 0; b < blocks; ++b) {
    if (b >= batch_first + batch_count) {  // node->key is block b - 1's key
      batch_first = b;
      batch_count = std::min(batch_size, blocks - b);
      batch_size = std::min(2 * batch_size, kKeyBatch);
      chained_keys(node->key, tokens, b, batch_count, tokens_per_block_unsigned, format, keys.data());
    }
    Digest key;
    std::memcpy(key.data(), keys.data() + 32 * (b - batch_first + 1), key.size());
    const std::size_t start = b * tokens_per_block_unsigned;
    const std::size_t end = std::min(start + tokens_per_block_unsigned, tokens.count);
    Block* child = node->child(key);
    if (child != nullptr) {
      path.emplace_back(child, static_cast<std::int64_t>(end - start));
      if (end - start == tokens_per_block_unsigned) {
        node = child;
        continue;
      }
      break;
    }
    if (partial && node->children().size() < kPartialScanLimit) {
      Block* best = nullptr;
      std::int64_t best_len = 0;
      for (Block* candidate : node->children()) {
        const std::int64_t n = common_prefix(candidate->tokens(), tokens, start, end);
        if (n > best_len) {
          best = candidate;
          best_len = n;
        }
      }
      if (best != nullptr) path.emplace_back(best, best_len);
    }
    break;
  }
  return path;
}

Root* RadixTree::find_root(const Digest& root_key) const {
  const auto it = roots_.find(root_key);
  return it == roots_.end() ? nullptr : it->second.get();
}

Root* RadixTree::root(const Digest& root_key, const ReuseScope& scope) {
  if (Root* r = find_root(root_key)) return r;
  auto owned = std::make_unique<Root>(root_key, scope);
  Root* raw = owned.get();
  roots_.emplace(root_key, std::move(owned));
  root_order_.push_back(raw);
  return raw;
}

Block* RadixTree::add(Node* parent, const Digest& key, const TokenList& source, std::size_t begin, std::size_t end,
                      std::int64_t ordinal) {
  Block* added = new_block(key, parent, ordinal);
  const bool is_partial = static_cast<std::int64_t>(end - begin) < tokens_per_block_;
  try {
    const TokenHeader header = store_tokens(added->area(), area_bytes_, added->header(), source, begin, end);
    added->token_size_ = header.size;
    added->tokens_wide_ = header.wide;
    added->tokens_digests_ = header.digests;
    added->tokens_heap_ = header.heap;
    added->partial_ = is_partial;
    parent->order_.add(added);
  } catch (...) {
    free_block(added);
    throw;
  }
  if (!is_partial) {
    if (ghost != nullptr) ghost->forget(added->key);
    if (scope_free != nullptr) {
      try {
        scope_free->added(added);
      } catch (const std::bad_alloc&) {
        // Only a diagnosis: the block is in the tree, unknown to the index (a miss of it reads
        // as never seen rather than other scope).
      }
    }
  }
  return added;
}

void RadixTree::recycle(Block* block) noexcept {
  if (block->children().empty()) {  // a leaf, the usual case: no list to build
    free_block(block);
    return;
  }
  // Parents before children; each child taken out of its parent's list before the parent goes.
  std::vector<Block*> pending;
  try {
    pending.push_back(block);
    while (!pending.empty()) {
      Block* b = pending.back();
      pending.pop_back();
      while (!b->children().empty()) {
        Block* child = b->children().back();
        b->order_.remove(child);
        pending.push_back(child);
      }
      free_block(b);
    }
  } catch (const std::bad_alloc&) {
    // Out of memory for the list: the blocks not freed stay in the arena until it goes.
  }
}

Block* RadixTree::covering_sibling(const Node* parent, const TokenList& tokens) {
  for (Block* child : parent->children()) {
    if (is_proper_prefix(tokens, child->tokens())) return child;
  }
  return nullptr;
}

Block* RadixTree::covered_sibling(const Node* parent, const TokenList& tokens) {
  if (parent->children().partial() == 0) return nullptr;
  for (Block* child : parent->children()) {
    if (is_proper_prefix(child->tokens(), tokens)) return child;
  }
  return nullptr;
}

std::vector<Block*> RadixTree::subtree(Block* block) {
  std::vector<Block*> out;
  std::vector<Block*> stack{block};
  while (!stack.empty()) {
    Block* b = stack.back();
    stack.pop_back();
    out.push_back(b);
    const ChildList& kids = b->children();
    const std::size_t first = stack.size();
    stack.insert(stack.end(), kids.begin(), kids.end());
    std::reverse(stack.begin() + static_cast<std::ptrdiff_t>(first), stack.end());
  }
  return out;
}

Block* RadixTree::detach(Block* block, std::optional<int> level) {
  block->parent->order_.remove(block);
  if (block->children().empty()) {
    left(block, level);
  } else if ((ghost != nullptr && level) || scope_free != nullptr) {
    try {
      // Descendants before ancestors: the ghost record's order is every backend's.
      const std::vector<Block*> blocks = subtree(block);
      for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) left(*it, level);
    } catch (const std::bad_alloc&) {
      // No list, no report: the index forgets all rather than keep addresses soon reused.
      if (scope_free != nullptr) scope_free->clear();
    }
  }
  return block;
}

void RadixTree::left(const Block* block, std::optional<int> level) noexcept {
  if (block->partial()) return;
  if (ghost != nullptr && level) {
    try {
      ghost->record(block->key, *level);
    } catch (const std::bad_alloc&) {
      // Only a diagnosis: the block is forgotten (a miss of it reads as never seen).
    }
  }
  if (scope_free != nullptr) scope_free->removed(block);  // before the block may be recycled
}

void RadixTree::prune(Node* node, std::optional<int> level) {
  while (!node->is_root()) {
    Block* block = static_cast<Block*>(node);
    if (!block->children().empty() || block->has_pages() || block->pins) return;
    Node* parent = block->parent;
    parent->order_.remove(block);
    left(block, level);
    free_block(block);
    node = parent;
  }
  if (node->children().empty()) {
    root_order_.erase(std::find(root_order_.begin(), root_order_.end(), node));
    roots_.erase(node->key);
  }
}

void RadixTree::clear() {
  if (on_remove) on_remove(nullptr);
  const auto told = std::move(on_remove);  // told of all at once: not of each block again
  destroy_blocks();
  on_remove = told;
  roots_.clear();
  root_order_.clear();
  if (scope_free != nullptr) scope_free->clear();
}

}  // namespace kvcore
