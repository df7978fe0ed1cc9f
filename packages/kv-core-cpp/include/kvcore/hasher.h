// Streams one block key: SHA-256(parent key || token bytes of the block), as block_keys.py hashes
// one. A Hasher is one stream's state, with no lock: one thread's at a time. It keeps the SHA-256
// transform active when it was built (sha256.h).
#pragma once

#include <cstddef>

#include "kvcore/sha256.h"
#include "kvcore/tokens.h"

namespace kvcore {

class Hasher {
 public:
  explicit Hasher(KeyFormat format) noexcept : format_(format) {}

  void begin(const Digest& parent) noexcept;
  // Tokens [begin, end) of `tokens`; `digest` is the cursor into tokens.digests (advanced).
  // Ids are written straight from the buffer when its encoding is the format's, else packed
  // through a 4 KB stack buffer, one SHA-256 write per 4 KB. Digest tokens split the runs.
  void write(const Tokens& tokens, std::size_t begin, std::size_t end, std::size_t& digest) noexcept;
  Digest finish() noexcept { return sha_.finish(); }

 private:
  void write_ids(const Tokens& tokens, std::size_t begin, std::size_t end) noexcept;

  KeyFormat format_;
  Sha256 sha_;
};

}  // namespace kvcore
