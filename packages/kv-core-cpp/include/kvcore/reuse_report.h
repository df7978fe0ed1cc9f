// Why a prompt missed (docs/manager.md, "Why a prompt missed"; mirrors reuse_report.py): the part
// of a prompt a reuse match did not walk, split into evicted (the ghost record knows the block),
// partial (the tail shorter than a block; tokens shared below a block boundary), other scope
// (opt-in) and never seen. The manager counts the stale and capped parts from its match; a
// KVCache joins them with its reused tokens per level (ReuseReport).
//
// Plain functions and values: find_misses reads the tree (REQUIRES: the manager's lock).
#pragma once

#include <cstdint>
#include <vector>

#include "kvcore/ghost_record.h"
#include "kvcore/prompt_keys.h"
#include "kvcore/radix_tree.h"
#include "kvcore/tokens.h"

namespace kvcore {

// kv_api.stats.ReuseReport: the parts add up to num_prompt_tokens.
struct ReuseReport {
  std::int64_t num_prompt_tokens = 0;
  std::vector<std::int64_t> reused_tokens_by_level;
  std::int64_t miss_stale_tokens = 0;
  std::int64_t miss_capped_tokens = 0;
  std::int64_t miss_evicted_tokens = 0;
  std::int64_t miss_partial_tokens = 0;
  std::int64_t miss_never_seen_tokens = 0;
  std::int64_t miss_other_scope_tokens = 0;
  std::vector<EvictedBlock> evicted_blocks;  // in prompt order
};

// A prompt's tokens not reused, by reason (ReuseReport's miss_* fields).
struct Misses {
  std::int64_t num_prompt_tokens = 0;
  std::int64_t stale = 0;
  std::int64_t capped = 0;
  std::int64_t evicted = 0;
  std::int64_t partial = 0;
  std::int64_t never_seen = 0;
  std::int64_t other_scope = 0;
  std::vector<EvictedBlock> evicted_blocks;
  PromptKeys keys;  // the blocks hashed past the walk, for the cache's commit

  ReuseReport report(const std::vector<std::int64_t>& reused_tokens_by_level) const;
};

// The tokens past the `walked` ones, by reason. `parent`: the walk's last full block before them
// (nullptr: the root). Blocks the ghost record knows come first; the first block it does not know
// and every later one were never in this scope's tree (a block's parent stays while it has
// children, and is forgotten after them), unless another scope holds them. Keys are hashed a few
// blocks at a time, as far as the answer needs, and kept (Misses::keys).
Misses find_misses(const RadixTree& tree, const Digest& root_key, const Tokens& tokens, std::int64_t walked,
                   const Block* parent, bool partial_reuse, KeyFormat format);

}  // namespace kvcore
