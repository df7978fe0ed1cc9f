// One request's KV cache: its blocks, pages and lengths, and the state machine over them
// (docs/manager.md, "KV cache").
//
// Guarantees: every page a cache hands out (get_base_page_indices, a caller's index buffer) is
// locked on the device level while the cache is ACTIVE and holds the data committed or written
// for it; a call that returns false or throws leaves the cache and the manager as they were,
// except where a member says otherwise (resize after a failed copy). The cache owns its holds on
// pages and its pins on tree blocks, and gives them all back at close(); the manager owns the
// pages, the tree and the CacheContext, and outlives the cache's use of them.
//
// Threads: public members take the manager's lock (CacheContext::lock()) themselves; members
// marked "REQUIRES: the manager's lock" expect the caller to hold it (the lock is recursive, so a
// public member may call another). The fixed fields (id, scope, tokens_per_block) need no lock.
//
// The class is declared here and defined part by part, file for file as kv_core_py's mixins:
// cache_state.cc (page steps), page_indices.cc, cache_scratch.cc, cache_room.cc,
// cache_commit.cc, cache_resize.cc, and kv_cache.cc (construction and the state machine).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kvcore/block_keys.h"
#include "kvcore/cache_state.h"
#include "kvcore/kept_list.h"
#include "kvcore/page.h"
#include "kvcore/planned_drop.h"
#include "kvcore/radix_tree.h"
#include "kvcore/request_stats.h"
#include "kvcore/reuse_report.h"
#include "kvcore/tokens.h"

namespace kvcore {

class CacheContext;

class KVCache {
 public:
  // SUSPENDED, on the matched prefix `path` (its pages held, priorities asked first so a failing
  // callback changes nothing); `fetched`: the blocks the remote tier brought for this match
  // (counted in cached_tokens_by_level's last column); `misses`: why the rest of the prompt missed
  // (nullptr: no reuse report). REQUIRES: the manager's lock.
  KVCache(CacheContext& context, std::int64_t id, const ReuseScope& scope, const Digest& root_key, TokenList tokens,
          const MatchPath& path, PriorityCallback priority, RequestStats request_stats,
          const std::vector<const Block*>& fetched = {}, Misses* misses = nullptr);
  ~KVCache();  // closes an open cache unless the manager shut down or is poisoned
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  std::int64_t id() const { return id_; }
  const ReuseScope& reuse_scope() const { return scope_; }
  CacheStatus status() const { return status_; }
  std::int64_t num_committed_tokens() const { return static_cast<std::int64_t>(tokens_.size()); }
  const TokenList& committed_tokens() const { return tokens_; }
  std::int64_t history_length() const { return history_; }
  std::int64_t capacity() const { return capacity_; }
  CommitState commit_state() const { return commit_state_; }
  KeyFormat key_format() const;
  std::int64_t num_blocks() const { return static_cast<std::int64_t>(blocks_.size()); }
  std::int64_t num_reused_tokens() const { return num_reused_; }
  std::int64_t tokens_per_block() const { return tokens_per_block_; }
  // Whether committing `added` more tokens fills a block (one to hash; a remote tier's write).
  bool fills_block(std::size_t added) const noexcept {
    const auto tokens_per_block = static_cast<std::size_t>(tokens_per_block_);
    return tokens_.size() % tokens_per_block + added >= tokens_per_block;
  }
  const CacheContext& context() const { return context_; }
  CacheContext& context() { return context_; }
  int num_layer_groups() const;

  // Error(kInvalidState) unless the cache is in `status`; bindings check it before converting
  // arguments, as the Python backend does.
  void require(CacheStatus status, const char* api) const;
  void require_commit_allowed() const;  // Error(kLogic) after stop_committing()

  // -- kv_cache.cc: the state machine --
  // SUSPENDED -> ACTIVE; false (nothing changed) above max_util_for_resume or short of pages.
  bool resume();
  std::vector<Page*> held_pages() const;  // every page the cache holds (for a quota resize)
  // SUSPENDED: the pages resume() would lock that sit below `target_level` moved up to it, all or
  // nothing (false: no room, nothing changed).
  bool prefetch(int target_level);
  void suspend();  // ACTIVE -> SUSPENDED: pages stay held but are unlocked
  void close();    // commits the partial tail, gives every page back, unregisters; idempotent
  // close() for a cache its owner dropped (a finaliser): the store is not handed what is staged
  // (a finaliser may run inside the store's own code, its lock held); the next close does it.
  void close_dropped();

  // -- cache_resize.cc --
  // ACTIVE: new lengths; Error(kValue) for lengths the rules refuse, false (nothing changed) when
  // pages run out. A copy that fails after releases leaves the new lengths and a SUSPENDED cache.
  bool resize(std::optional<std::int64_t> capacity, std::optional<std::int64_t> history_length);
  // Error(kValue) with scratch reuse on: the capacity setter (the binding calls it first).
  void require_capacity_settable() const;

  // -- cache_commit.cc --
  // Throws Error(kLogic) with commit_min_snapshot when the history is neither the committed count
  // before nor after the call.
  // `keys`: the keys of the full blocks the commit fills, when the caller hashed them (a batch
  // hashes several caches' blocks together), from commit_keys_parent's key.
  void commit(const TokenList& tokens, bool is_end, const std::uint8_t* keys = nullptr);
  // The same for tokens [begin, end) of `src`, read in place (a batch's share of its buffer).
  void commit(const Tokens& src, std::size_t begin, std::size_t end, bool is_end, const std::uint8_t* keys = nullptr);
  // The key the full blocks a commit fills chain from (block num_committed / tokens_per_block's parent), or
  // nullopt when the commit puts no block into the tree (committing stopped). Changes nothing.
  std::optional<Digest> commit_keys_parent() const;
  void stop_committing();
  // A plan to drop the committed tokens' trailing window pages and last SSM snapshot (plan_drop);
  // nullptr for None. Error(kLogic) before stop_committing().
  std::unique_ptr<PlannedDropHandle> plan_committed_block_drop();

  // -- page_indices.cc (a layer group the binding checked) --
  std::vector<std::int32_t> get_base_page_indices(int layer_group) const;
  // The slot of the request's state in an SSM layer group while active, else kBadPageIndex.
  std::int32_t get_ssm_block_base_index(int layer_group) const;
  // Per block, the level of the cache's page in `layer_group` (-1 where it has none).
  std::vector<std::int32_t> get_page_levels(int layer_group) const;
  // Per cache level, the reused tokens found there when the cache was created.
  const std::vector<std::int64_t>& cached_tokens_by_level() const { return cached_by_level_; }
  // Why each prompt token was or was not reused at creation (nullopt with reuse_report off).
  const std::optional<ReuseReport>& reuse_report() const { return reuse_report_; }
  // Validates and attaches (or, with data == nullptr, detaches) a caller's index buffer.
  void set_base_page_index_buf(int layer_group, IndexBuffer buffer);

  // -- cache_scratch.cc: sliding-window scratch, on by default where configured --
  bool enable_swa_scratch_reuse() const { return scratch_on_; }
  // Error(kValue) when turned on without the config's swa_scratch_reuse, or changed while the
  // cache has scratch blocks.
  void set_enable_swa_scratch_reuse(bool value);
  bool has_scratch_slots() const;
  // The layer group's scratch blocks [first, second) and their slots; none without scratch slots.
  std::optional<std::pair<std::pair<std::int64_t, std::int64_t>, std::vector<std::int32_t>>> get_scratch_desc(
      int layer_group) const;

  RequestStats stats;  // feeds the manager's statistics and the request's own

 private:
  // (ordinal, layer group): a page to allocate; ordinal -1 is a scratch slot (no block).
  using Need = std::pair<std::int64_t, int>;
  // A page to give up; `keep` holds it (unlocked) for a commit.
  struct Release {
    std::int64_t ordinal;
    int layer_group;
    bool keep;
  };
  // What a resize releases and needs, worked out before anything changes (cache_resize.cc).
  struct ResizePlan {
    std::vector<Need> shrink;            // pages of the blocks past the new end, last first
    std::vector<Release> releases;       // stale pages below the new end
    std::vector<Release> scratch_drops;  // pages of blocks entering the scratch range
    std::vector<Page*> scratch_freed;    // scratch slots past the new count
    std::vector<Need> needs;
    std::vector<int> priorities;
    void clear() noexcept;  // each list emptied, its memory kept
  };
  using Range = std::pair<std::int64_t, std::int64_t>;
  static bool in_range(const Range& range, std::int64_t ordinal) {
    return range.first <= ordinal && ordinal < range.second;
  }

  // Everything below REQUIRES: the manager's lock.

  // -- kv_cache.cc --
  // The constructor's share: blocks and holds.
  void hold_matched(const MatchPath& path, const std::vector<const Block*>& fetched);
  std::pair<std::vector<Need>, std::vector<int>> resume_needs();  // and their priorities
  void place_resumed(const std::vector<Need>& needs, const std::vector<Page*>& fresh);
  // What a page resume() allocates starts as: the reused snapshot (SSM state), the reused partial
  // block's page (a copy), or nothing.
  Page* source_of(std::int64_t ordinal, int layer_group) const;
  void close_locked();

  // -- cache_state.cc: the page steps every part takes --
  int priority_of(std::int64_t ordinal, int layer_group);
  void set_index(std::int64_t ordinal, int layer_group, std::int32_t value);
  void lock_page(std::int64_t ordinal, int layer_group);
  void unlock_page(std::int64_t ordinal, int layer_group);
  void release_page(std::int64_t ordinal, int layer_group);
  bool is_stale(int layer_group, std::int64_t ordinal, std::int64_t history) const;
  // Per layer group, its stale range at `history` (is_stale, computed once for a loop over blocks).
  std::vector<Range> stale_ranges(std::int64_t history) const;
  void unlock_states();

  // -- page_indices.cc --
  void sync_user_buffers();

  // -- cache_scratch.cc --
  // The layer group's scratch blocks [a, b) at these lengths (a == b: none), and the slots they need.
  Range scratch_range(int layer_group, std::int64_t capacity, std::int64_t history) const;
  std::int64_t scratch_need(int layer_group, std::int64_t capacity, std::int64_t history) const;
  // Error(kValue) when scratch blocks leaving the scratch range would not be stale at `history`.
  void check_scratch_history(const char* api, std::int64_t capacity, std::int64_t history) const;
  void free_scratch(int layer_group, std::size_t keep);  // frees the slots beyond `keep`, last first

  // -- cache_room.cc: what a step needs, and "is there room", from cheapest to dearest --
  std::vector<Release> stale_releases(std::int64_t history) const;
  void apply_stale_releases(const std::vector<Release>& releases, std::int64_t history);
  // The ordinals of [first, num_blocks) with a page of their own in a layer group: below its
  // stale range, between it and the scratch range, and above that.
  std::array<Range, 3> live_ranges(int layer_group, std::int64_t first, std::int64_t num_blocks, std::int64_t capacity,
                                   std::int64_t history) const;
  void missing(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity, std::int64_t history,
               std::vector<Need>& out) const;  // into `out` (cleared first)
  std::vector<Need> missing(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity,
                            std::int64_t history) const;
  std::vector<Need> scratch_needs(std::int64_t capacity, std::int64_t history) const;
  // Could the pool groups ever hold blocks [first, num_blocks): counted, not listed.
  bool fits_pool_groups(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity, std::int64_t history) const;
  // Could room be made for `needs` once `releases` apply; changes nothing.
  bool can_make_room_after(const std::vector<Need>& needs, const std::vector<Release>& releases,
                           const std::vector<Page*>& scratch_freed);
  // Room at `level` for `pages` and `needs`, never evicting `keep`; false (nothing changed) if short.
  bool make_room(int level, const std::vector<Page*>& pages, const std::vector<Need>& needs,
                 const std::vector<Page*>& keep = {});
  // Into `out` (cleared first; a kept list on the resize path: no allocation).
  void new_pages(const std::vector<Need>& needs, const std::vector<int>& priorities, std::vector<Page*>& out);
  std::vector<Page*> to_lock() const;  // the pages resume() locks
  void suspend_locked();               // unlocks every page and frees the scratch slots

  // -- cache_commit.cc --
  Node* parent_node(std::int64_t ordinal);
  std::optional<Digest> commit_keys_parent_at(std::int64_t ordinal) const;
  // Blocks [first, last)'s keys chained from `parent`, as chained_keys writes them into `out`.
  void hash_keys(const Digest& parent, std::int64_t first, std::int64_t last, std::uint8_t* out) const;
  // `pages` (a partial tail only) replaces the block's own: snapshot copies, or live pages and states.
  // `key`: the block's key when the caller computed it (a run of blocks hashed in one call).
  void commit_block(std::int64_t ordinal, const std::vector<Page*>* pages = nullptr, const std::uint8_t* key = nullptr);
  // Our page of block `ordinal` meets the tree block's in one layer group (rebase, or attach).
  void join(Block* block, std::int64_t ordinal, int layer_group, Page* ours, std::int64_t num_tokens);
  // `page` (uncommitted) becomes the block's page in `layer_group`, valid for `num_tokens`.
  void attach(Block* block, int layer_group, Page* page, std::int64_t num_tokens);
  // commit_min_snapshot: the state reusable at the committed length enters the tree; `move`
  // gives the live pages, otherwise copies.
  void snapshot(bool move);
  // What snapshot() puts into the tree: false for nothing; else `block` (nullptr: the partial
  // tail, committed with them) and the (layer group, page) sources.
  bool snapshot_sources(Block*& block, std::vector<std::pair<int, Page*>>& sources) const;
  // New device pages holding `sources`' data (held once each); empty without room.
  std::vector<Page*> copies(const std::vector<Page*>& sources);
  void stop_committing_locked(bool move_state = false);

  // -- cache_resize.cc --
  std::pair<std::int64_t, std::int64_t> checked_lengths(std::optional<std::int64_t> capacity,
                                                        std::optional<std::int64_t> history_length) const;
  // Into `plan` (emptied first).
  void resize_plan(std::int64_t num_blocks, std::int64_t capacity, std::int64_t history, ResizePlan& plan);
  void apply_resize(const ResizePlan& plan, std::int64_t num_blocks, std::int64_t capacity, std::int64_t history);

  CacheContext& context_;  // all the cache uses of its manager's state (the manager owns it)
  std::int64_t id_;
  ReuseScope scope_;
  Digest root_key_;
  PriorityCallback priority_;
  CacheStatus status_ = CacheStatus::kSuspended;
  CommitState commit_state_ = CommitState::kAllowed;
  TokenList tokens_;
  std::int64_t history_;
  std::int64_t capacity_;
  std::int64_t tokens_per_block_;
  std::size_t num_layer_groups_;
  const std::vector<int>& block_layer_groups_;  // layer groups with a page per block (attention)
  // Every layer group is full attention (no window, no SSM state, so no scratch): nothing goes
  // stale, and a resize within the blocks held changes only the lengths.
  const bool full_attention_only_;
  const std::vector<int>& ssm_layer_groups_;
  std::int64_t num_reused_;
  std::vector<CacheBlock> blocks_;
  std::vector<std::vector<std::int32_t>> index_;  // per layer group, the slot of each block's locked page
  std::map<int, IndexBuffer> user_buffers_;       // per layer group, a caller's buffer mirroring index_
  std::vector<std::int64_t> stale_scan_;          // per layer group: stale blocks below are cleared
  std::vector<std::int64_t> cached_by_level_;
  std::optional<ReuseReport> reuse_report_;
  PromptKeys prompt_keys_;  // the report's keys past the match, until a commit fills blocks
  // Per SSM layer group: the request's state (allocated by the first resume), whether it is
  // locked, and the reused snapshot resume copies into it (the match ends on it).
  std::vector<Page*> ssm_state_;
  std::vector<bool> ssm_locked_;
  std::vector<Page*> ssm_snapshot_;
  std::vector<Page*> tree_holds_;  // tree pages held besides our private ones, for blocks we pin
  // Sliding-window scratch: on or off, and per layer group the shared slots of its scratch
  // blocks (locked while active, freed on suspend).
  bool scratch_on_;
  std::vector<std::vector<Page*>> scratch_pages_;
  // Lists a resize fills and keeps for the next (kept_list.h), so that a decode step's new page
  // allocates nothing.
  struct WorkLists {
    KeptList<std::pair<int, int>> requests;  // new_pages': (layer group, priority)
    KeptList<Page*> pages;                   // the pages a resize got
    KeptList<std::uint64_t> per_pool_group;  // fits_pool_groups' and make_room's counts
    KeptList<Release> applied;               // a resize's releases, in the order they apply
    KeptList<ResizePlan> plan;               // one
    KeptList<const Page*> kept;              // make_room's pages not to evict
  };
  mutable WorkLists work_;  // fits_pool_groups (const) counts in it too
};

}  // namespace kvcore
