// Chained block keys (docs/key-format.md; mirrors block_keys.py): root = SHA-256(scope bytes),
// key[i] = SHA-256(key[i-1] || token bytes of block i); a partial last block hashes only its tokens.
//
// The functions read the tokens in place (the caller keeps them alive for the call), write only
// `out`, share no state but the SHA-256 transform (chosen once: sha256.h) and take no lock: any
// thread may call them (the binding does, without the GIL, for long inputs). A BlockKeyIterator
// owns its tokens and is one thread's at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kvcore/hasher.h"
#include "kvcore/tokens.h"

namespace kvcore {

// Matches only happen within one scope: a LoRA adapter and a tenant salt (absent != 0).
struct ReuseScope {
  std::optional<std::uint64_t> lora_id;
  std::optional<std::uint64_t> salt;
};

// One mask byte (bit 0: lora present, bit 1: salt present), then each present field u64 LE.
std::vector<std::uint8_t> reuse_scope_to_bytes(const ReuseScope& scope);
Digest root_key(const ReuseScope& scope);

// Keys of blocks [first, first + count) of `tokens`, chained from `parent` (the key of block
// first - 1, or the root): writes `parent` then the keys into `out` (32 * (1 + count) bytes).
// Runs of full blocks without digest tokens go through the fused chain kernel.
void chained_keys(const Digest& parent, const Tokens& tokens, std::size_t first, std::size_t count,
                  std::size_t tokens_per_block, KeyFormat format, std::uint8_t* out) noexcept;

// Writes the root key then one key per block into `out` (32 * (1 + blocks) bytes).
void block_keys(std::size_t tokens_per_block, const ReuseScope& scope, const Tokens& tokens, KeyFormat format,
                std::uint8_t* out) noexcept;

// One chain of block_keys_many: its scope, its tokens, and where its keys go (32 * (1 + blocks) bytes).
struct KeyChainInput {
  ReuseScope scope;
  const Tokens* tokens;
  std::uint8_t* out;
};

// block_keys for every input, writing exactly what block_keys writes (chained_keys_many from
// each input's root key).
void block_keys_many(std::size_t tokens_per_block, const KeyChainInput* inputs, std::size_t count, KeyFormat format);

// One chain of chained_keys_many: blocks [first, first + count) of `tokens`, chained from
// `parent`, written to `out` as chained_keys writes them (parent, then one key per block).
struct KeyChainRun {
  Digest parent;
  const Tokens* tokens;
  std::size_t first;
  std::size_t count;
  std::uint8_t* out;
};

// chained_keys for every run. The leading full blocks of each run without a digest token are
// hashed four chains at a time through sha256::chain_keys4 (two, then one, when fewer are left),
// read in place in the format's encoding, else packed into it first (up to 1 MiB a run), grouped
// greedily in run order (a chain that ends hands its slot to the next one); the rest of each run
// goes through chained_keys.
void chained_keys_many(std::size_t tokens_per_block, const KeyChainRun* runs, std::size_t count, KeyFormat format);

// The same keys one block at a time; it owns its tokens so it may outlive the caller's buffer.
class BlockKeyIterator {
 public:
  BlockKeyIterator(std::size_t tokens_per_block, const ReuseScope& scope, Tokens tokens, KeyFormat format);

  bool done() const noexcept { return started_ && next_ >= tokens_.count; }
  const Tokens& tokens() const noexcept { return tokens_; }
  // Advances; returns the key of the block [begin, end) (the root first, with begin == end).
  Digest next(std::size_t& begin, std::size_t& end) noexcept;

 private:
  std::size_t tokens_per_block_;
  Tokens tokens_;
  Hasher hasher_;
  Digest key_;
  std::size_t next_ = 0;
  std::size_t digest_ = 0;
  bool started_ = false;
};

}  // namespace kvcore
