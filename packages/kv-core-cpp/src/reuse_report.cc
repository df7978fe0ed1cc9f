// Why a prompt missed (reuse_report.py).
#include "kvcore/reuse_report.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "kvcore/block_keys.h"
#include "kvcore/scope_free_index.h"

namespace kvcore {

namespace {

// Blocks hashed ahead: one first (most prompts stop there), doubling up to kKeyRun while they
// go on, as the walk's do; a stop wastes at most the rest of a batch.
constexpr std::size_t kFirstKeys = 1;
constexpr std::size_t kKeyRun = 64;

// The keys of blocks first, first + 1, ... (below `end`) of `tokens`, chained from `parent`
// (block first - 1's key), one per next().
class KeyCursor {
 public:
  // `ghost`: where the keys are looked up, its index lines asked for as each batch is hashed;
  // `kept`: where each batch's keys are kept for the commit.
  KeyCursor(const Digest& parent, const Tokens& tokens, std::int64_t first, std::int64_t end,
            std::int64_t tokens_per_block, KeyFormat format, const GhostRecord* ghost = nullptr,
            PromptKeys* kept = nullptr)
      : tokens_(tokens),
        first_(static_cast<std::size_t>(first)),
        next_(static_cast<std::size_t>(first)),
        end_(static_cast<std::size_t>(end)),
        tokens_per_block_(static_cast<std::size_t>(tokens_per_block)),
        format_(format),
        ghost_(ghost),
        kept_(kept) {
    std::memcpy(keys_.data(), parent.data(), 32);
  }

  Digest next() {  // REQUIRES: a block below `end` is left
    if (taken_ == batch_) {
      Digest last;
      std::memcpy(last.data(), keys_.data() + 32 * batch_, 32);
      batch_ = std::min(size_, end_ - next_);
      size_ = std::min(2 * size_, kKeyRun);
      chained_keys(last, tokens_, next_, batch_, tokens_per_block_, format_, keys_.data());
      if (kept_ != nullptr) {
        // Keys kept, and the cursor past its first batch (most prompts stop there): it is likely
        // to go on, so room for the rest of the prompt at once.
        if (kept_->size() != 0 && kept_->size() == next_ - first_) kept_->reserve(end_ - next_, tokens_per_block_);
        kept_->keep(tokens_, last, static_cast<std::int64_t>(next_), batch_, tokens_per_block_, keys_.data());
      }
      if (ghost_ != nullptr) {
        for (std::size_t i = 1; i <= batch_; ++i) ghost_->prefetch(keys_.data() + 32 * i);
      }
      taken_ = 0;
    }
    Digest key;
    std::memcpy(key.data(), keys_.data() + 32 * ++taken_, 32);
    ++next_;
    return key;
  }

 private:
  const Tokens& tokens_;
  std::size_t first_;  // the first block hashed
  std::size_t next_;   // the block next() hashes or hands out next
  std::size_t end_;
  std::size_t tokens_per_block_;
  KeyFormat format_;
  const GhostRecord* ghost_;
  PromptKeys* kept_;
  std::array<std::uint8_t, 32 * (kKeyRun + 1)> keys_;  // the batch's parent, then its keys
  std::size_t batch_ = 0;                              // keys in the batch
  std::size_t taken_ = 0;                              // of them handed out
  std::size_t size_ = kFirstKeys;                      // the next batch's
};

// Block `count - 1`'s key chained from `root` (`root` for none), in runs of kKeyRun blocks.
Digest key_after(const Digest& root, const Tokens& tokens, std::int64_t count, std::int64_t tokens_per_block,
                 KeyFormat format) {
  std::array<std::uint8_t, 32 * (kKeyRun + 1)> out;
  Digest key = root;
  for (std::size_t first = 0; first < static_cast<std::size_t>(count); first += kKeyRun) {
    const std::size_t n = std::min(kKeyRun, static_cast<std::size_t>(count) - first);
    chained_keys(key, tokens, first, n, static_cast<std::size_t>(tokens_per_block), format, out.data());
    std::memcpy(key.data(), out.data() + 32 * n, key.size());
  }
  return key;
}

// The most tokens of block `ordinal` a child of `node` starts with (what partial reuse would
// have matched); 0 where the walk would not scan (too many children).
std::int64_t shared_below_boundary(const Node* node, const Tokens& tokens, std::int64_t ordinal,
                                   std::int64_t tokens_per_block) {
  if (node == nullptr || node->children().size() >= kPartialScanLimit) return 0;
  const auto begin = static_cast<std::size_t>(ordinal * tokens_per_block);
  const auto end = static_cast<std::size_t>((ordinal + 1) * tokens_per_block);
  std::int64_t best = 0;
  for (const Block* child : node->children()) best = std::max(best, common_prefix(child->tokens(), tokens, begin, end));
  return best;
}

// Counts the blocks from `ordinal` on that another scope holds (stopping at the first it does
// not); the first token past them.
std::int64_t other_scope(const RadixTree& tree, const Tokens& tokens, std::int64_t ordinal, std::int64_t full,
                         std::int64_t pos, KeyFormat format, Misses& misses) {
  const ScopeFreeIndex& index = *tree.scope_free;
  const std::int64_t tokens_per_block = tree.tokens_per_block();
  KeyCursor keys(key_after(kScopeFreeRoot, tokens, ordinal, tokens_per_block, format), tokens, ordinal, full,
                 tokens_per_block, format);
  while (ordinal < full) {
    if (!index.contains(keys.next())) break;
    ++ordinal;
    misses.other_scope += ordinal * tokens_per_block - pos;
    pos = ordinal * tokens_per_block;
  }
  return pos;
}

}  // namespace

ReuseReport Misses::report(const std::vector<std::int64_t>& reused_tokens_by_level) const {
  ReuseReport out;
  out.num_prompt_tokens = num_prompt_tokens;
  out.reused_tokens_by_level = reused_tokens_by_level;
  out.miss_stale_tokens = stale;
  out.miss_capped_tokens = capped;
  out.miss_evicted_tokens = evicted;
  out.miss_partial_tokens = partial;
  out.miss_never_seen_tokens = never_seen;
  out.miss_other_scope_tokens = other_scope;
  out.evicted_blocks = evicted_blocks;
  return out;
}

Misses find_misses(const RadixTree& tree, const Digest& root_key, const Tokens& tokens, std::int64_t walked,
                   const Block* parent, bool partial_reuse, KeyFormat format) {
  const std::int64_t tokens_per_block = tree.tokens_per_block();
  const auto length = static_cast<std::int64_t>(tokens.count);
  const std::int64_t full = length / tokens_per_block;
  Misses misses;
  misses.num_prompt_tokens = length;
  misses.partial = length - std::max(walked, full * tokens_per_block);
  std::int64_t pos = walked;  // the first token not accounted for
  std::int64_t ordinal = walked / tokens_per_block;
  const GhostRecord* ghost = tree.ghost.get();
  KeyCursor keys(parent != nullptr ? parent->key : root_key, tokens, ordinal, full, tokens_per_block, format, ghost,
                 &misses.keys);
  while (ordinal < full && ghost != nullptr && ghost->size() != 0) {
    const std::optional<EvictedBlock> entry = ghost->find(keys.next());
    if (!entry) break;
    misses.evicted_blocks.push_back(*entry);
    ++ordinal;
    misses.evicted += ordinal * tokens_per_block - pos;
    pos = ordinal * tokens_per_block;
  }
  if (ordinal >= full) return misses;
  if (pos == walked && pos % tokens_per_block == 0 && !partial_reuse) {
    const Node* node = parent != nullptr ? static_cast<const Node*>(parent) : tree.find_root(root_key);
    const std::int64_t lost = shared_below_boundary(node, tokens, ordinal, tokens_per_block);
    misses.partial += lost;
    pos += lost;
  }
  if (tree.scope_free != nullptr) pos = other_scope(tree, tokens, ordinal, full, pos, format, misses);
  misses.never_seen = full * tokens_per_block - pos;
  return misses;
}

}  // namespace kvcore
