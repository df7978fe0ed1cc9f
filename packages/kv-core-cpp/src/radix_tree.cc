#include "kvcore/radix_tree.h"

#include <algorithm>

#include "kvcore/hasher.h"

namespace kvcore {

Block* Node::child(const Digest& key) const {
  const auto it = children_.find(key);
  return it == children_.end() ? nullptr : it->second.get();
}

Block* Node::add_child(std::unique_ptr<Block> block) {
  Block* raw = block.get();
  order_.push_back(raw);
  children_.emplace(raw->key, std::move(block));
  return raw;
}

std::unique_ptr<Block> Node::take_child(Block* block) {
  order_.erase(std::find(order_.begin(), order_.end(), block));
  auto it = children_.find(block->key);
  std::unique_ptr<Block> out = std::move(it->second);
  children_.erase(it);
  return out;
}

bool Block::has_pages() const {
  return std::any_of(pages.begin(), pages.end(), [](const Page* p) { return p != nullptr; });
}

Digest chunk_key(const Digest& parent, const TokenList& tokens, std::size_t begin, std::size_t end, KeyFormat format) {
  const Tokens view = tokens.view();
  std::size_t cursor = tokens.first_digest_at_or_after(begin);
  Hasher hasher(format);
  hasher.begin(parent);
  hasher.write(view, begin, end, cursor);
  return hasher.finish();
}

namespace {

std::int64_t common_prefix(const TokenList& a, const TokenList& b, std::size_t b_begin, std::size_t b_end) {
  const std::size_t n = std::min(a.size(), b_end - b_begin);
  for (std::size_t i = 0; i < n; ++i) {
    if (!a.same(i, b, b_begin + i)) return static_cast<std::int64_t>(i);
  }
  return static_cast<std::int64_t>(n);
}

}  // namespace

MatchPath RadixTree::walk(const Digest& root_key, const TokenList& tokens, std::int64_t tokens_per_block,
                          KeyFormat format, bool partial) const {
  MatchPath path;
  const Node* node = find_root(root_key);
  if (node == nullptr) return path;
  const std::size_t tpb = static_cast<std::size_t>(tokens_per_block);
  for (std::size_t start = 0; start < tokens.size(); start += tpb) {
    const std::size_t end = std::min(start + tpb, tokens.size());
    Block* child = node->child(chunk_key(node->key, tokens, start, end, format));
    if (child != nullptr) {
      path.emplace_back(child, static_cast<std::int64_t>(end - start));
      if (end - start == tpb) {
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

Block* RadixTree::add(Node* parent, const Digest& key, TokenList tokens, std::int64_t ordinal) {
  return parent->add_child(std::make_unique<Block>(key, parent, std::move(tokens), ordinal, num_life_cycles_));
}

std::vector<Block*> RadixTree::subtree(Block* block) {
  std::vector<Block*> out;
  std::vector<Block*> stack{block};
  while (!stack.empty()) {
    Block* b = stack.back();
    stack.pop_back();
    out.push_back(b);
    const auto& kids = b->children();
    stack.insert(stack.end(), kids.rbegin(), kids.rend());
  }
  return out;
}

void RadixTree::prune(Node* node) {
  while (!node->is_root()) {
    Block* block = static_cast<Block*>(node);
    if (!block->children().empty() || block->has_pages()) return;
    Node* parent = block->parent;
    parent->take_child(block);  // destroys it
    node = parent;
  }
  if (node->children().empty()) {
    root_order_.erase(std::find(root_order_.begin(), root_order_.end(), node));
    roots_.erase(node->key);
  }
}

void RadixTree::clear() {
  roots_.clear();
  root_order_.clear();
}

}  // namespace kvcore
