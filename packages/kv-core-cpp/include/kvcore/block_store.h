// kv_api.BlockStore as the core calls it (docs/store.md): a store of block values shared beyond
// one manager, read and written in batches of a chain's consecutive blocks. The binding's
// adapter calls the Python store; the remote tier (remote_tier.h) checks what it answers.
//
// Threads: called with the manager's lock held, on the thread of the manager call; the binding's
// adapter takes the GIL for each call (docs/architecture.md, Threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvcore/sha256.h"

namespace kvcore {

// One value's destination: `size` writable bytes at `data`.
struct ValueBuffer {
  std::uint8_t* data = nullptr;
  std::size_t size = 0;
};

// A chain's consecutive blocks' store keys: `ns` then each of the `size` chained keys at `keys`
// (the caller's, valid for the call). The binding hands the store a kv_api.StoreKeys, which
// builds each key where it is read: a cold admission asks about thousands of blocks.
struct StoreKeys {
  std::string_view ns;
  const Digest* keys = nullptr;
  std::size_t size = 0;
};

class BlockStore {
 public:
  virtual ~BlockStore() = default;
  // How many of `keys` the store has, from the first; what the store answered, or -1 where it
  // raised or answered no integer (the caller checks the range: a store is a cache, its faults
  // are misses).
  virtual std::int64_t contains(const StoreKeys& keys) = 0;
  // Copies the value of keys[i] into buffers[i] for each i < n; n as contains() answers it.
  virtual std::int64_t get_into(const StoreKeys& keys, const std::vector<ValueBuffer>& buffers) = 0;
  // Hands the store the value of each of `keys`: keys.size() values of `value_size` bytes, back to
  // back at `values` (the caller's, valid for the call: the store copies what it keeps).
  // Returns -1 where it raised, else the pause it answered: the seconds (0: none, infinity: for
  // ever) to hand it nothing, a store that drops every put for now (kv_core_py's pause_of).
  virtual double put(const std::vector<std::string>& keys, const std::uint8_t* values, std::size_t value_size) = 0;
};

}  // namespace kvcore
