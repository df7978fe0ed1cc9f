#include "kvcore/radix_tree.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "kvcore/constants.h"
#include "kvcore/ghost_record.h"
#include "kvcore/scope_free_index.h"

namespace kvcore {

Node::~Node() {
  // Take the descendants apart one by one: destroying a chain of blocks recursively would use a
  // stack frame per block, and a long prompt is a chain of thousands.
  std::vector<Block*> pending(order_.begin(), order_.end());
  order_.clear();
  while (!pending.empty()) {
    Block* block = pending.back();
    pending.pop_back();
    pending.insert(pending.end(), block->order_.begin(), block->order_.end());
    block->order_.clear();
    delete block;  // childless now
  }
}

Block* Node::add_child(std::unique_ptr<Block> block, bool partial) {
  order_.add(block.get(), partial);
  return block.release();
}

std::unique_ptr<Block> Node::take_child(Block* block, bool partial) {
  order_.remove(block, partial);
  return std::unique_ptr<Block>(block);
}

void Block::reuse(const Digest& new_key, Node* new_parent, std::int64_t new_ordinal) {
  key = new_key;
  parent = new_parent;
  set_lora(new_parent);
  ordinal = new_ordinal;
  std::fill(pages.begin(), pages.end(), nullptr);
  has_v1_ = false;
  pins = 0;
}

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

RadixTree::RadixTree(std::size_t num_layer_groups, std::int64_t tokens_per_block)
    : num_layer_groups_(num_layer_groups), tokens_per_block_(tokens_per_block) {}

RadixTree::~RadixTree() = default;  // here, where GhostRecord and ScopeFreeIndex are complete

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
        const std::int64_t n = common_prefix(candidate->tokens, tokens, start, end);
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
  std::unique_ptr<Block> block;
  if (spare_.empty()) {
    block = std::make_unique<Block>(key, parent, ordinal, num_layer_groups_);
  } else {
    block = std::move(spare_.back());
    spare_.pop_back();
    spare_bytes_ -= block->tokens.capacity_bytes();
    block->reuse(key, parent, ordinal);
  }
  block->tokens.assign(source, begin, end);
  const bool is_partial = partial(block.get());
  Block* added = parent->add_child(std::move(block), is_partial);
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

void RadixTree::keep_spare(std::unique_ptr<Block> block) noexcept {
  if (on_remove) on_remove(block.get());
  const std::size_t bytes = block->tokens.capacity_bytes();
  if (spare_.size() >= kSpareBlocks || spare_bytes_ + bytes > kSpareTokenBytes) return;  // freed here
  if (spare_.capacity() < kSpareBlocks) {
    try {
      spare_.reserve(kSpareBlocks);
    } catch (const std::bad_alloc&) {
      return;  // a spare only saves an allocation later
    }
  }
  spare_.push_back(std::move(block));  // within the capacity: cannot throw
  spare_bytes_ += bytes;
}

void RadixTree::recycle(std::unique_ptr<Block> block) noexcept {
  if (block->children().empty()) {  // a leaf, the usual case: no list to build
    keep_spare(std::move(block));
    return;
  }
  std::vector<std::unique_ptr<Block>> pending;
  try {
    pending.push_back(std::move(block));
    while (!pending.empty()) {
      std::unique_ptr<Block> b = std::move(pending.back());
      pending.pop_back();
      while (!b->children().empty()) {
        Block* child = b->children().back();
        pending.push_back(b->take_child(child, partial(child)));
      }
      keep_spare(std::move(b));
    }
  } catch (const std::bad_alloc&) {
    // Out of memory for the list: the blocks not kept are freed as they go out of scope.
  }
}

Block* RadixTree::covering_sibling(const Node* parent, const TokenList& tokens) {
  for (Block* child : parent->children()) {
    if (is_proper_prefix(tokens, child->tokens)) return child;
  }
  return nullptr;
}

Block* RadixTree::covered_sibling(const Node* parent, const TokenList& tokens) {
  if (parent->children().partial() == 0) return nullptr;
  for (Block* child : parent->children()) {
    if (is_proper_prefix(child->tokens, tokens)) return child;
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

std::unique_ptr<Block> RadixTree::detach(Block* block, std::optional<int> level) {
  std::unique_ptr<Block> owned = block->parent->take_child(block, partial(block));
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
  return owned;
}

void RadixTree::left(const Block* block, std::optional<int> level) noexcept {
  if (partial(block)) return;
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
    std::unique_ptr<Block> owned = parent->take_child(block, partial(block));
    left(block, level);
    recycle(std::move(owned));
    node = parent;
  }
  if (node->children().empty()) {
    root_order_.erase(std::find(root_order_.begin(), root_order_.end(), node));
    roots_.erase(node->key);
  }
}

void RadixTree::clear() {
  if (on_remove) on_remove(nullptr);
  roots_.clear();
  root_order_.clear();
  if (scope_free != nullptr) scope_free->clear();
}

}  // namespace kvcore
