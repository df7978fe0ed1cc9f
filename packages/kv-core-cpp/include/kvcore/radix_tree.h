// The radix tree of committed blocks, keyed by chained block keys (docs/manager.md, "Reuse";
// mirrors radix_tree.py). Each scope has its own root; no child's tokens are a proper prefix of a
// sibling's; children keep insertion order, which decides ties when a partial match scans
// siblings, so every backend picks the same block.
//
// The tree owns its roots and blocks (each node its children). A block's pages are Storage's
// records: the tree points to them and never frees one. Storage takes the pages out of a block
// before it leaves the tree (drop, adopt, clear), and prune() removes only blocks without page,
// child or pin. A block's address is stable while it is in the tree; a removed block may be
// recycled by the next add(), so a pointer kept across a removal may name another block.
//
// Threads: no lock of its own; every member REQUIRES: the manager's lock (the thread rule:
// docs/architecture.md, Threads). walk() only reads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvcore/block_keys.h"
#include "kvcore/block_tokens.h"
#include "kvcore/child_list.h"
#include "kvcore/page.h"
#include "kvcore/per_layer_group.h"
#include "kvcore/tokens.h"

namespace kvcore {

// Siblings are scanned for a partial match only when there are fewer than this many.
constexpr std::size_t kPartialScanLimit = 32;
// A node looks its children up by scanning them up to this many, by a hash index beyond: most
// nodes of a long prompt have one child, and a scan touches only the child itself, where a hash
// map costs a bucket array and a map node per lookup (the walk's cache misses).
constexpr std::size_t kChildScanLimit = 8;
// Blocks a tree keeps for reuse (RadixTree::recycle), and the token storage they may hold in
// all (1 MiB, whatever the block size). None under AddressSanitizer, so that a
// use after removal is still reported.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kSpareBlocks = 0;
#else
constexpr std::size_t kSpareBlocks = 4096;
#endif
constexpr std::size_t kSpareTokenBytes = std::size_t{1} << 20;

class Block;
class GhostRecord;
class ScopeFreeIndex;

// A root or a block. Not polymorphic (no virtual table: a tree holds millions of blocks): a
// node is deleted as what it is, a Root by the tree's root map, a Block by its parent or a
// unique_ptr<Block>.
class Node {
 public:
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  bool is_root() const noexcept { return root_; }

  Block* child(const Digest& key) const { return order_.find(key); }
  const ChildList& children() const { return order_; }
  // `partial`: the block holds fewer tokens than a full one (the tree knows the block size).
  Block* add_child(std::unique_ptr<Block> block, bool partial);
  std::unique_ptr<Block> take_child(Block* block, bool partial);

  Digest key;
  Node* parent;

 protected:
  Node(const Digest& key, Node* parent, bool root) : key(key), parent(parent), root_(root) {}
  ~Node();

 private:
  ChildList order_;  // the children, owned, in insertion order (and their key index)
  bool root_;

 protected:
  // A block's small fields, here where they fill what Node leaves of its last word: whether
  // lora_ and v1_ hold a value, and v1_'s fallback flag.
  bool has_lora_ = false;
  bool has_v1_ = false;
  bool v1_fell_back_ = false;
};

class Root : public Node {
 public:
  Root(const Digest& key, const ReuseScope& scope) : Node(key, nullptr, true), scope(scope) {}
  ReuseScope scope;
};

class Block : public Node {
 public:
  Block(const Digest& key, Node* parent, std::int64_t ordinal, std::size_t num_layer_groups)
      : Node(key, parent, false), ordinal(ordinal), pages(num_layer_groups, nullptr) {
    set_lora(parent);
  }
  bool has_pages() const;
  // A spare block (childless, out of the tree) made new under `parent`; its token and child
  // storage is kept for reuse, the tokens are the caller's to fill.
  void reuse(const Digest& new_key, Node* new_parent, std::int64_t new_ordinal);

  // The scope's LoRA adapter, for events (the root knows the scope; blocks copy it down).
  std::optional<std::uint64_t> lora_id() const {
    return has_lora_ ? std::optional<std::uint64_t>(lora_) : std::nullopt;
  }
  // The event manager's cached v1 hash and whether it fell back (event_manager.h).
  std::optional<std::pair<std::uint64_t, bool>> v1_hash() const {
    return has_v1_ ? std::optional<std::pair<std::uint64_t, bool>>(std::make_pair(v1_, v1_fell_back_)) : std::nullopt;
  }
  void set_v1_hash(std::uint64_t hash, bool fell_back) noexcept {
    v1_ = hash;
    v1_fell_back_ = fell_back;
    has_v1_ = true;
  }

  int pins = 0;  // open caches whose next commits hang under this block: never pruned
  std::int64_t ordinal;
  BlockTokens tokens;
  PerLayerGroup<Page*, 1> pages;  // one per layer group (inline for one: the usual layout)

 private:
  std::uint64_t lora_ = 0;
  std::uint64_t v1_ = 0;

  void set_lora(const Node* parent) {
    const std::optional<std::uint64_t> lora = parent->is_root() ? static_cast<const Root*>(parent)->scope.lora_id
                                                                : static_cast<const Block*>(parent)->lora_id();
    has_lora_ = lora.has_value();
    lora_ = lora.value_or(0);
  }
};

using MatchPath = std::vector<std::pair<Block*, std::int64_t>>;

// How many of tokens [b_begin, b_end) of `b` the tokens of `a` start with (digest tokens match
// by digest).
std::int64_t common_prefix(const BlockTokens& a, const Tokens& b, std::size_t b_begin, std::size_t b_end);

class RadixTree {
 public:
  RadixTree(std::size_t num_layer_groups, std::int64_t tokens_per_block);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  std::int64_t tokens_per_block() const { return tokens_per_block_; }

  // The longest chain of blocks matching `tokens` under `root_key`, as (block, tokens matched in
  // it): whole blocks by key, the partial tail by its tokens' key; at a miss, with `partial`, the
  // child sharing the longest token prefix (the first such in insertion order, scanned only below
  // kPartialScanLimit children). Keys are computed in batches through the chain kernel, a few
  // blocks past a miss at most.
  MatchPath walk(const Digest& root_key, const Tokens& tokens, std::int64_t tokens_per_block, KeyFormat format,
                 bool partial) const;
  Root* find_root(const Digest& root_key) const;
  Root* root(const Digest& root_key, const ReuseScope& scope);
  // A new child of `parent` holding tokens [begin, end) of `source`; a full one is back in the
  // tree for the ghost record and the scope-free index.
  Block* add(Node* parent, const Digest& key, const TokenList& source, std::size_t begin, std::size_t end,
             std::int64_t ordinal);
  // A child of `parent` whose tokens strictly extend `tokens`: a partial block of `tokens`
  // beside it would hold nothing it does not.
  static Block* covering_sibling(const Node* parent, const TokenList& tokens);
  // The partial child of `parent` whose tokens `tokens` strictly extend. There is at most one:
  // a partial block is never added beside a child extending it, and a block added beside a
  // partial child it extends replaces that child. Only partial children are scanned, and none
  // where there are none: a full prefill under a root of thousands of prompts costs no scan.
  static Block* covered_sibling(const Node* parent, const TokenList& tokens);
  // `block` and its descendants, parents before children, children in insertion order.
  static std::vector<Block*> subtree(Block* block);
  // Takes `block` and its subtree out of the tree. `level`: the cache level an eviction dropped it
  // from (nullopt: not an eviction, the ghost record is not told). The blocks are valid until
  // recycled.
  std::unique_ptr<Block> detach(Block* block, std::optional<int> level = std::nullopt);
  // Takes back a detached block and its subtree: up to kSpareBlocks are kept for add() to reuse
  // with their token and child storage, since a prefill commits and an eviction drops hundreds
  // of blocks, and the heap allocations of each (block, token list, child list) cost more than
  // the rest of its work.
  void recycle(std::unique_ptr<Block> block) noexcept;
  // Remove `node` and its ancestors while childless, page-less and unpinned; drop a childless
  // root. `level` as for detach().
  void prune(Node* node, std::optional<int> level = std::nullopt);
  const std::vector<Root*>& roots() const { return root_order_; }
  void clear();  // every block leaves, not evicted: the ghost record keeps what it knew
  // Told of every block leaving the tree (nullptr: all of them, clear()), before it may be
  // recycled: the remote tier forgets the blocks it was to write. Must not throw.
  std::function<void(const Block*)> on_remove;
  // What the reuse report reads (reuse_report.h); set by the manager where configured.
  std::unique_ptr<GhostRecord> ghost;
  std::unique_ptr<ScopeFreeIndex> scope_free;

 private:
  std::size_t num_layer_groups_;
  std::int64_t tokens_per_block_;
  std::unordered_map<Digest, std::unique_ptr<Root>, DigestHash> roots_;
  std::vector<Root*> root_order_;
  std::vector<std::unique_ptr<Block>> spare_;
  std::size_t spare_bytes_ = 0;  // the token storage of the spare blocks

  void keep_spare(std::unique_ptr<Block> block) noexcept;  // or let it go, past the limits
  // `block` left the tree (of a subtree, descendants before ancestors): the ghost record (for an
  // eviction) and the scope-free index hear of a full one.
  void left(const Block* block, std::optional<int> level) noexcept;
  bool partial(const Block* block) const { return static_cast<std::int64_t>(block->tokens.size()) < tokens_per_block_; }
};

}  // namespace kvcore
