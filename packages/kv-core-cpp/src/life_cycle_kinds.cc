#include "kvcore/life_cycle_kinds.h"

#include <algorithm>

#include "kvcore/constants.h"

namespace kvcore {

std::optional<std::int64_t> LifeCycleKind::peak_history(std::int64_t) const { return std::nullopt; }

std::int64_t LifeCycleKind::sinks_reached(std::int64_t history) const {
  return std::min(ceil_div(history, tokens_per_block_), life_cycle_.num_sink_blocks);
}

std::pair<std::int64_t, std::int64_t> FullAttention::stale_range(std::int64_t history) const {
  const std::int64_t s = sinks_reached(history);
  return {s, s};
}

std::int64_t FullAttention::slots_floor(const std::vector<std::int64_t>& window_floors) const {
  // Shares a pool group with windows, whose straddling block it must leave room for.
  return window_floors.empty() ? 1 : *std::max_element(window_floors.begin(), window_floors.end());
}

std::optional<std::int64_t> FullAttention::planned_drop_first(std::int64_t, std::int64_t) const {
  return std::nullopt;  // later turns reuse every block
}

std::int64_t SlidingWindow::window_floor() const {
  return life_cycle_.num_sink_blocks + (*life_cycle_.window + tokens_per_block_ - 2) / tokens_per_block_ + 1;
}

std::pair<std::int64_t, std::int64_t> SlidingWindow::stale_range(std::int64_t history) const {
  const std::int64_t s = sinks_reached(history);
  // Floor division as Python's: history + 1 - window may be negative.
  const std::int64_t n = history + 1 - *life_cycle_.window;
  const std::int64_t q = n >= 0 ? n / tokens_per_block_ : -ceil_div(-n, tokens_per_block_);
  return {s, std::max(s, q)};
}

bool SlidingWindow::drop_takes_subtree(std::int64_t ordinal) const {
  return ordinal < life_cycle_.num_sink_blocks;  // a sink page is needed by every later step
}

std::optional<std::int64_t> SlidingWindow::planned_drop_first(std::int64_t num_tokens, std::int64_t num_blocks) const {
  // From the end of the stale range (never a sink block: the range starts after them).
  return std::min(stale_range(num_tokens).second, num_blocks);
}

std::optional<std::int64_t> SlidingWindow::peak_history(std::int64_t last) const {
  // The need is periodic once blocks turn stale, highest just before the stale range grows:
  // (h + 2 - W) mod tokens_per_block == 0, the modulo non-negative as Python's.
  const std::int64_t h =
      last - (((last + 2 - *life_cycle_.window) % tokens_per_block_) + tokens_per_block_) % tokens_per_block_;
  if (h < 0) return std::nullopt;
  return h;
}

std::pair<std::int64_t, std::int64_t> StateSpace::stale_range(std::int64_t history) const {
  return {0, history / tokens_per_block_};  // only the request's state is needed, no block's pages
}

std::optional<std::int64_t> StateSpace::planned_drop_first(std::int64_t, std::int64_t num_blocks) const {
  return num_blocks - 1;  // the last block's snapshot
}

std::shared_ptr<const LifeCycleKind> kind_of(const LifeCycle& life_cycle, std::int64_t tokens_per_block) {
  if (life_cycle.ssm) return std::make_shared<StateSpace>(life_cycle, tokens_per_block);
  if (!life_cycle.window) return std::make_shared<FullAttention>(life_cycle, tokens_per_block);
  return std::make_shared<SlidingWindow>(life_cycle, tokens_per_block);
}

}  // namespace kvcore
