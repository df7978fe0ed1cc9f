// What differs between the three kinds of life cycle (full attention, a sliding window, SSM
// state), behind one small interface (life_cycle_kinds.py): the code asks a layer group's kind
// instead of branching on `window` and `ssm` wherever the kinds part ways.
//
// A kind is immutable once built and owned by the LifeCycleRegistry; any thread may ask it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace kvcore {

struct LifeCycle {
  int id = 0;
  std::optional<std::int64_t> window;  // none: full attention
  std::int64_t num_sink_blocks = 0;
  bool ssm = false;  // the state-space layers: a state per request, no page per block
};

class LifeCycleKind {
 public:
  LifeCycleKind(const LifeCycle& life_cycle, std::int64_t tokens_per_block)
      : life_cycle_(life_cycle), tokens_per_block_(tokens_per_block) {}
  virtual ~LifeCycleKind() = default;
  const LifeCycle& life_cycle() const { return life_cycle_; }

  // A page per block (attention), or one state per request (SSM).
  virtual bool has_block_pages() const { return true; }
  // Sliding-window scratch may apply.
  virtual bool has_scratch() const { return false; }
  // Some block can go stale (a window's, an SSM's); full attention needs every block.
  virtual bool goes_stale() const { return true; }
  // Blocks [first, second) not needed for the next step at `history` tokens (the rule of
  // kv_api.LifeCycle.get_stale_range, which priority callbacks see).
  virtual std::pair<std::int64_t, std::int64_t> stale_range(std::int64_t history) const = 0;
  // Slots one request may need at once; `window_floors`: the window kinds' own.
  virtual std::int64_t slots_floor(const std::vector<std::int64_t>& window_floors) const = 0;
  // Whether losing block `ordinal`'s page makes every later block unusable.
  virtual bool drop_takes_subtree(std::int64_t ordinal) const = 0;
  // The first of a request's `num_blocks` matched blocks whose page a planned drop covers once
  // `num_tokens` are committed; nullopt: none is.
  virtual std::optional<std::int64_t> planned_drop_first(std::int64_t num_tokens, std::int64_t num_blocks) const = 0;
  // A history below `last` where a request growing one token per step may need more slots than
  // at `last`; nullopt: the need never falls.
  virtual std::optional<std::int64_t> peak_history(std::int64_t last) const;

 protected:
  // min(ceil(history / tokens_per_block), sink blocks): the sink blocks a history has reached, never stale.
  std::int64_t sinks_reached(std::int64_t history) const;

  LifeCycle life_cycle_;
  std::int64_t tokens_per_block_;
};

class FullAttention final : public LifeCycleKind {
 public:
  using LifeCycleKind::LifeCycleKind;
  bool goes_stale() const override { return false; }
  std::pair<std::int64_t, std::int64_t> stale_range(std::int64_t history) const override;
  std::int64_t slots_floor(const std::vector<std::int64_t>& window_floors) const override;
  bool drop_takes_subtree(std::int64_t) const override { return true; }
  std::optional<std::int64_t> planned_drop_first(std::int64_t, std::int64_t) const override;
};

class SlidingWindow final : public LifeCycleKind {
 public:
  using LifeCycleKind::LifeCycleKind;
  bool has_scratch() const override { return true; }
  std::int64_t window_floor() const;  // a window straddles one extra block while it slides
  std::pair<std::int64_t, std::int64_t> stale_range(std::int64_t history) const override;
  std::int64_t slots_floor(const std::vector<std::int64_t>&) const override { return window_floor(); }
  bool drop_takes_subtree(std::int64_t ordinal) const override;
  std::optional<std::int64_t> planned_drop_first(std::int64_t num_tokens, std::int64_t num_blocks) const override;
  std::optional<std::int64_t> peak_history(std::int64_t last) const override;
};

class StateSpace final : public LifeCycleKind {
 public:
  using LifeCycleKind::LifeCycleKind;
  bool has_block_pages() const override { return false; }
  std::pair<std::int64_t, std::int64_t> stale_range(std::int64_t history) const override;
  std::int64_t slots_floor(const std::vector<std::int64_t>&) const override { return 1; }  // the request's state
  bool drop_takes_subtree(std::int64_t) const override { return false; }
  std::optional<std::int64_t> planned_drop_first(std::int64_t, std::int64_t num_blocks) const override;
};

std::shared_ptr<const LifeCycleKind> kind_of(const LifeCycle& life_cycle, std::int64_t tokens_per_block);

}  // namespace kvcore
