// One request's KV cache: its blocks, pages and lengths, and the state machine over them
// (see kv_cache.py; the two must stay step-for-step alike).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kvcore/block_keys.h"
#include "kvcore/page.h"
#include "kvcore/per_life_cycle.h"
#include "kvcore/planned_drop.h"
#include "kvcore/radix_tree.h"
#include "kvcore/request_stats.h"
#include "kvcore/tokens.h"

namespace kvcore {

class CacheContext;

enum class CacheStatus { kActive = 0, kSuspended = 1, kClosed = 2 };
enum class CommitState { kAllowed = 0, kUserStop = 1, kVirtualStop = 2 };

// (ordinal, life cycle) -> priority in [0, 100]; may throw (a Python callback's error).
using PriorityCallback = std::function<int(std::int64_t, int)>;

struct CacheBlock {
  explicit CacheBlock(std::size_t num_life_cycles) : pages(num_life_cycles, nullptr), locked(num_life_cycles, false) {}
  PerLifeCycle<Page*> pages;
  PerLifeCycle<bool> locked;
  Block* tree_block = nullptr;  // the tree block once this block is committed
  bool copy_on_resume = false;  // pages are a reused partial block's, shared with the tree
};

// A caller's int32 buffer kept updated with one layer group's page indices.
struct IndexBuffer {
  std::int32_t* data = nullptr;
  std::size_t size = 0;
};

class KVCache {
 public:
  KVCache(CacheContext& context, std::int64_t id, const ReuseScope& scope, const Digest& root_key, TokenList tokens,
          const MatchPath& path, PriorityCallback priority, RequestStats request_stats);
  ~KVCache();
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
  std::int64_t tokens_per_block() const { return tpb_; }
  const CacheContext& context() const { return context_; }
  CacheContext& context() { return context_; }

  // Error(kInvalidState) unless the cache is in `status`; bindings check it before converting
  // arguments, as the Python backend does.
  void require(CacheStatus status, const char* api) const;
  void require_commit_allowed() const;  // Error(kLogic) after stop_committing()

  bool resume();
  std::vector<Page*> held_pages() const;  // every page the cache holds (for a quota resize)
  // SUSPENDED: the pages resume() would lock that sit below `target_level` moved up to it, all or
  // nothing (false: no room, nothing changed).
  bool prefetch(int target_level);
  void suspend();
  bool resize(std::optional<std::int64_t> capacity, std::optional<std::int64_t> history_length);
  // Throws Error(kLogic) with commit_min_snapshot when the history is neither the committed count
  // before nor after the call.
  // `keys`: the keys of the full blocks the commit fills, when the caller hashed them (a batch
  // hashes several caches' blocks together), from commit_keys_parent's key.
  void commit(const TokenList& tokens, bool is_end, const std::uint8_t* keys = nullptr);
  // The same for tokens [begin, end) of `src`, read in place (a batch's share of its buffer).
  void commit(const Tokens& src, std::size_t begin, std::size_t end, bool is_end, const std::uint8_t* keys = nullptr);
  // The key the full blocks a commit fills chain from (block num_committed / tpb's parent), or
  // nullopt when the commit puts no block into the tree (committing stopped). Changes nothing.
  std::optional<Digest> commit_keys_parent() const;
  void stop_committing();
  void close();
  // A plan to drop the committed tokens' trailing window pages and last SSM snapshot (plan_drop);
  // nullptr for None. Error(kLogic) before stop_committing().
  std::unique_ptr<PlannedDropHandle> plan_committed_block_drop();

  std::vector<std::int32_t> get_base_page_indices(int layer_group) const;
  // The slot of the request's state in an SSM layer group while active, else kBadPageIndex.
  std::int32_t get_ssm_block_base_index(int layer_group) const;
  // Per block, the level of the cache's page in `layer_group` (-1 where it has none).
  std::vector<std::int32_t> get_page_levels(int layer_group) const;
  // Per cache level, the reused tokens found there when the cache was created.
  const std::vector<std::int64_t>& cached_tokens_by_level() const { return cached_by_level_; }
  // Validates and attaches (or, with data == nullptr, detaches) a caller's index buffer.
  void set_base_page_index_buf(int layer_group, IndexBuffer buffer);
  int num_layer_groups() const;

  RequestStats stats;  // feeds the manager's statistics and the request's own
  // Sliding-window scratch (see kv_cache.py): on by default where configured.
  bool enable_swa_scratch_reuse() const { return scratch_on_; }
  // Error(kValue) when turned on without the config's swa_scratch_reuse, or changed while the
  // cache has scratch blocks.
  void set_enable_swa_scratch_reuse(bool value);
  bool has_scratch_slots() const;
  // The layer group's scratch blocks [first, second) and their slots; none without scratch slots.
  std::optional<std::pair<std::pair<std::int64_t, std::int64_t>, std::vector<std::int32_t>>> get_scratch_desc(
      int layer_group) const;
  // Error(kValue) with scratch reuse on: the capacity setter (the binding calls it first).
  void require_capacity_settable() const;

 private:
  int priority_of(std::int64_t ordinal, int lc);
  void set_index(std::int64_t ordinal, int lc, std::int32_t value);
  void lock_page(std::int64_t ordinal, int lc);
  void unlock_page(std::int64_t ordinal, int lc);
  void release_page(std::int64_t ordinal, int lc);
  bool is_stale(int lc, std::int64_t ordinal, std::int64_t history) const;
  // Per life cycle, its stale range at `history` (is_stale, computed once for a loop over blocks).
  std::vector<std::pair<std::int64_t, std::int64_t>> stale_ranges(std::int64_t history) const;
  static bool in_range(const std::pair<std::int64_t, std::int64_t>& range, std::int64_t ordinal) {
    return range.first <= ordinal && ordinal < range.second;
  }
  struct Release {
    std::int64_t ordinal;
    int lc;
    bool keep;
  };
  std::vector<Release> stale_releases(std::int64_t history) const;
  void apply_stale_releases(const std::vector<Release>& releases, std::int64_t history);
  bool fits(const std::vector<std::pair<std::int64_t, int>>& needs, const std::vector<Release>& releases,
            const std::vector<Page*>& scratch_freed);
  std::vector<Page*> to_lock() const;
  // What a page resume() allocates starts as: the reused snapshot (SSM state), the reused partial
  // block's page (a copy), or nothing.
  Page* source_of(std::int64_t ordinal, int lc) const;
  void unlock_states();
  // `page` (uncommitted) becomes the block's page in `lc`, valid for `num_tokens`.
  void attach(Block* block, int lc, Page* page, std::int64_t num_tokens);
  // commit_min_snapshot: the state reusable at the committed length enters the tree; `move`
  // gives the live pages, otherwise copies.
  void snapshot(bool move);
  // New device pages holding `sources`' data (held once each); empty without room.
  std::vector<Page*> copies(const std::vector<Page*>& sources);
  // Room at `level` for `pages` and `needs`, never evicting `keep`; false (nothing changed) if short.
  bool make_room(int level, const std::vector<Page*>& pages, const std::vector<std::pair<std::int64_t, int>>& needs,
                 const std::vector<Page*>& keep = {});
  std::vector<Page*> new_pages(const std::vector<std::pair<std::int64_t, int>>& needs,
                               const std::vector<int>& priorities);
  std::vector<std::pair<std::int64_t, int>> missing(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity,
                                                    std::int64_t history) const;
  // The non-stale ordinals of [first, num_blocks) in a life cycle: below and above its stale range.
  std::array<std::pair<std::int64_t, std::int64_t>, 3> live_ranges(int lc, std::int64_t first, std::int64_t num_blocks,
                                                                   std::int64_t capacity, std::int64_t history) const;
  bool may_fit(std::int64_t first, std::int64_t num_blocks, std::int64_t capacity, std::int64_t history) const;
  // The life cycle's scratch blocks [a, b) at these lengths (a == b: none), and the slots they need.
  std::pair<std::int64_t, std::int64_t> scratch_range(int lc, std::int64_t capacity, std::int64_t history) const;
  std::int64_t scratch_need(int lc, std::int64_t capacity, std::int64_t history) const;
  // Error(kValue) when scratch blocks leaving the scratch range would not be stale at `history`.
  void check_scratch_history(const char* api, std::int64_t capacity, std::int64_t history) const;
  void free_scratch(int lc, std::size_t keep);  // frees the life cycle's scratch slots beyond `keep`
  Node* parent_node(std::int64_t ordinal);
  std::optional<Digest> commit_keys_parent_at(std::int64_t ordinal) const;
  // `pages` (a partial tail only) replaces the block's own: snapshot copies, or live pages and states.
  // `key`: the block's key when the caller computed it (a run of blocks hashed in one call).
  void commit_block(std::int64_t ordinal, const std::vector<Page*>* pages = nullptr, const std::uint8_t* key = nullptr);
  void stop_committing_locked(bool move_state = false);
  void suspend_locked();
  void sync_user_buffers();
  void close_locked();

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
  std::int64_t tpb_;
  std::size_t num_lcs_;
  const std::vector<int>& block_lcs_;  // life cycles with a page per block (attention)
  // Every life cycle is full attention (no window, no SSM state, so no scratch): nothing goes
  // stale, and a resize within the blocks held changes only the lengths.
  const bool full_attention_only_;
  const std::vector<int>& ssm_lcs_;
  std::int64_t num_reused_;
  std::vector<CacheBlock> blocks_;
  std::vector<std::vector<std::int32_t>> index_;
  std::map<int, IndexBuffer> user_buffers_;
  std::vector<std::int64_t> stale_scan_;  // per life cycle: stale blocks below are cleared
  std::vector<std::int64_t> cached_by_level_;
  // Per SSM life cycle: the request's state (allocated by the first resume), whether it is
  // locked, and the reused snapshot resume copies into it (the match ends on it).
  std::vector<Page*> ssm_state_;
  std::vector<bool> ssm_locked_;
  std::vector<Page*> ssm_snapshot_;
  std::vector<Page*> tree_holds_;  // tree pages held besides our private ones, for blocks we pin
  // Sliding-window scratch: on or off, and per life cycle the shared slots of its scratch blocks
  // (locked while active, freed on suspend).
  bool scratch_on_;
  std::vector<std::vector<Page*>> scratch_pages_;
};

}  // namespace kvcore
