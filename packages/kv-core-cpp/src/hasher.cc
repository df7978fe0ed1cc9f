#include "kvcore/hasher.h"

#include <cstdint>
#include <cstring>

namespace kvcore {

void Hasher::begin(const Digest& parent) noexcept {
  sha_.reset();
  sha_.write(parent.data(), parent.size());
}

void Hasher::write(const Tokens& tokens, std::size_t begin, std::size_t end, std::size_t& digest) noexcept {
  const auto& digests = tokens.digests;
  while (begin < end) {
    const bool split = digest < digests.size() && digests[digest].position < end;
    const std::size_t stop = split ? digests[digest].position : end;
    write_ids(tokens, begin, stop);
    if (!split) break;
    sha_.write(digests[digest].digest.data(), digests[digest].digest.size());
    ++digest;
    begin = stop + 1;
  }
}

void Hasher::write_ids(const Tokens& tokens, std::size_t begin, std::size_t end) noexcept {
  if (begin >= end) return;
  const std::size_t width = token_width(format_);
  if (tokens.width == width && tokens.contiguous()) {
    // Validated ids are already this format's little-endian bytes: no copy.
    sha_.write(tokens.data + begin * width, (end - begin) * width);
    return;
  }
  alignas(8) std::uint8_t buf[4096];
  const std::size_t per_flush = sizeof buf / width;
  while (begin < end) {
    const std::size_t n = end - begin < per_flush ? end - begin : per_flush;
    tokens.pack(begin, begin + n, width, buf);
    sha_.write(buf, n * width);
    begin += n;
  }
}

}  // namespace kvcore
