// The radix tree of committed blocks, keyed by chained block keys (docs/manager.md, "Reuse";
// mirrors radix_tree.py). Each scope has its own root; no child's tokens are a proper prefix of a
// sibling's; children keep insertion order, which decides ties when a partial match scans
// siblings, so every backend picks the same block.
//
// The tree owns its roots and blocks (the blocks in its arena). A block's pages are Storage's
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
#include "kvcore/block_pages.h"
#include "kvcore/block_tokens.h"
#include "kvcore/child_list.h"
#include "kvcore/page.h"
#include "kvcore/tokens.h"

namespace kvcore {

// Siblings are scanned for a partial match only when there are fewer than this many.
constexpr std::size_t kPartialScanLimit = 32;
// A node looks its children up by scanning them up to this many, by a hash index beyond: most
// nodes of a long prompt have one child, and a scan touches only the child itself, where a hash
// map costs a bucket array and a map node per lookup (the walk's cache misses).
constexpr std::size_t kChildScanLimit = 8;

class Block;
class GhostRecord;
class ScopeFreeIndex;

// A root or a block. Not polymorphic (no virtual table: a tree holds millions of blocks): the
// tree destroys a node as what it is.
class Node {
 public:
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  bool is_root() const noexcept { return root_; }
  // A block holding fewer tokens than a full one (the tree marks it as it fills the tokens).
  bool partial() const noexcept { return partial_; }

  Block* child(const Digest& key) const { return order_.find(key); }
  const ChildList& children() const { return order_; }

  Digest key;
  Node* parent;

 protected:
  Node(const Digest& key, Node* parent, bool root)
      : key(key),
        parent(parent),
        root_(root),
        partial_(0),
        token_size_(0),
        tokens_wide_(0),
        tokens_digests_(0),
        tokens_heap_(0) {}
  ~Node() = default;

  ChildList order_;  // the children (the tree owns them), in insertion order, and their key index
  // One word: the node's flags and a block's token header (block_tokens.h), in what Node leaves
  // of its last 8 bytes.
  std::uint32_t root_ : 1;
  std::uint32_t partial_ : 1;
  std::uint32_t token_size_ : 21;  // <= 2**20 (kv_api's TOKENS_PER_BLOCK_LIMIT)
  std::uint32_t tokens_wide_ : 1;
  std::uint32_t tokens_digests_ : 1;
  std::uint32_t tokens_heap_ : 1;

  friend class RadixTree;  // links children, marks partial_
};

class Root : public Node {
 public:
  Root(const Digest& key, const ReuseScope& scope) : Node(key, nullptr, true), scope(scope) {}
  ReuseScope scope;
};

// A tree block: 72 bytes, then its token area (block_tokens.h), in one slot of the tree's block
// arena (RadixTree::new_block). The scope (salt, LoRA adapter) is its root's: a caller that
// needs it knows the scope it works in.
class Block : public Node {
 public:
  Block(const Digest& key, Node* parent, std::int64_t ordinal, std::size_t num_layer_groups)
      : Node(key, parent, false), ordinal(ordinal), pages(num_layer_groups) {}
  ~Block() { release_tokens(area(), header()); }
  bool has_pages() const;
  BlockTokens tokens() const noexcept { return tokens_in(area(), header()); }

  int pins = 0;  // open caches whose next commits hang under this block: never pruned
  std::int64_t ordinal;
  BlockPages pages;  // one per layer group

 private:
  TokenHeader header() const noexcept {
    return {token_size_, tokens_wide_ != 0, tokens_digests_ != 0, tokens_heap_ != 0};
  }
  std::uint8_t* area() noexcept { return reinterpret_cast<std::uint8_t*>(this) + sizeof(Block); }
  const std::uint8_t* area() const noexcept { return reinterpret_cast<const std::uint8_t*>(this) + sizeof(Block); }

  friend class RadixTree;  // fills the tokens (with the area's size) and reuses blocks
};
static_assert(sizeof(void*) != 8 || sizeof(Block) == 72, "a tree block's size is docs/performance.md's");

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
  Block* detach(Block* block, std::optional<int> level = std::nullopt);
  // Takes back a detached block and its subtree: add() reuses them, with their child storage.
  void recycle(Block* block) noexcept;
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
  // The block arena: blocks live in slots of slot_bytes_ (a Block and its token area of
  // area_bytes_) carved from chunks (64 KiB doubling to 2 MiB, those huge pages: add_chunk), with
  // no allocator header and no separate token allocation (docs/performance.md, "Cost as the cache
  // grows"); a block leaving the tree goes to the spare list (linked through `parent`, still
  // constructed, its child storage kept) for add() to reuse. A tree keeps the memory of the most
  // blocks it held until it is cleared. Under AddressSanitizer every block is its own allocation
  // and none is reused, so that a use after removal is still reported.
  std::size_t area_bytes_;
  std::size_t slot_bytes_;
  std::vector<std::pair<std::uint8_t*, std::size_t>> chunks_;  // (address, bytes), owned
  std::size_t used_in_chunk_ = 0;                              // slots handed out of the last chunk
  std::size_t slots_in_chunk_ = 0;                             // the last chunk's
  Block* spare_ = nullptr;

  Block* new_block(const Digest& key, Node* parent, std::int64_t ordinal);
  void free_block(Block* block) noexcept;  // childless, out of the tree
  void destroy_blocks() noexcept;          // every block, in the tree and spare; the arena emptied
  void add_chunk();                        // std::bad_alloc: nothing changed
  // `block` left the tree (of a subtree, descendants before ancestors): the ghost record (for an
  // eviction) and the scope-free index hear of a full one.
  void left(const Block* block, std::optional<int> level) noexcept;
};

}  // namespace kvcore
