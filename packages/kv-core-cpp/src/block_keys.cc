#include "kvcore/block_keys.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace kvcore {

std::vector<std::uint8_t> reuse_scope_to_bytes(const ReuseScope& scope) {
  std::vector<std::uint8_t> out{static_cast<std::uint8_t>((scope.lora_id ? 1 : 0) | (scope.salt ? 2 : 0))};
  for (const auto& field : {scope.lora_id, scope.salt}) {
    if (!field) continue;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(*field >> (8 * i)));
  }
  return out;
}

Digest root_key(const ReuseScope& scope) {
  const std::vector<std::uint8_t> bytes = reuse_scope_to_bytes(scope);
  return sha256_digest(bytes.data(), bytes.size());
}

namespace {

// Keys of `n` full blocks starting at token `begin`, none holding a digest token, through the
// fused chain kernel: read in place when the buffer already has the format's encoding, else
// packed a few blocks at a time into a 4 KB stack buffer.
void full_block_keys(const Tokens& tokens, std::size_t begin, std::size_t n, std::size_t tokens_per_block,
                     KeyFormat format, std::uint8_t* out) noexcept {
  const std::size_t width = token_width(format);
  const std::size_t len = tokens_per_block * width;
  if (tokens.width == width && tokens.contiguous()) {
    sha256::chain_keys(out - 32, tokens.data + begin * width, len, n, out);
    return;
  }
  alignas(8) std::uint8_t buf[4096];
  const std::size_t per_pack = sizeof buf / len;  // >= 1: callers send bigger blocks elsewhere
  while (n != 0) {
    const std::size_t k = n < per_pack ? n : per_pack;
    tokens.pack(begin, begin + k * tokens_per_block, width, buf);
    sha256::chain_keys(out - 32, buf, len, k, out);
    out += 32 * k;
    begin += k * tokens_per_block;
    n -= k;
  }
}

}  // namespace

void chained_keys(const Digest& parent, const Tokens& tokens, std::size_t first, std::size_t count,
                  std::size_t tokens_per_block, KeyFormat format, std::uint8_t* out) noexcept {
  std::memcpy(out, parent.data(), parent.size());
  out += parent.size();  // `out - 32` is always the previous key
  const bool packable = tokens_per_block * token_width(format) <= 4096;
  const bool direct = tokens.width == token_width(format) && tokens.contiguous();
  const std::size_t stop_token = std::min(tokens.count, (first + count) * tokens_per_block);
  Hasher hasher(format);
  std::size_t begin = first * tokens_per_block;
  std::size_t digest = static_cast<std::size_t>(
      std::lower_bound(tokens.digests.begin(), tokens.digests.end(), begin,
                       [](const DigestToken& d, std::size_t pos) { return d.position < pos; }) -
      tokens.digests.begin());
  while (begin < stop_token) {
    const std::size_t next_digest = digest < tokens.digests.size() ? tokens.digests[digest].position : tokens.count;
    const std::size_t run = (std::min(next_digest, stop_token) - begin) / tokens_per_block;
    if (run != 0 && (direct || packable)) {
      full_block_keys(tokens, begin, run, tokens_per_block, format, out);
      out += 32 * run;
      begin += run * tokens_per_block;
      continue;
    }
    // A block holding a digest token, the partial tail, or a block too big to pack.
    const std::size_t end = std::min(begin + tokens_per_block, stop_token);
    Digest prev;
    std::memcpy(prev.data(), out - 32, prev.size());
    hasher.begin(prev);
    hasher.write(tokens, begin, end, digest);
    const Digest key = hasher.finish();
    std::memcpy(out, key.data(), key.size());
    out += key.size();
    begin = end;
  }
}

void block_keys(std::size_t tokens_per_block, const ReuseScope& scope, const Tokens& tokens, KeyFormat format,
                std::uint8_t* out) noexcept {
  chained_keys(root_key(scope), tokens, 0, ceil_div(tokens.count, tokens_per_block), tokens_per_block, format, out);
}

namespace {

// A run of full blocks still to hash: n keys of one chain, each block read from data (advancing
// by the block length), the previous key at out - 32.
struct PendingRun {
  const std::uint8_t* data;
  std::uint8_t* out;
  std::size_t n;
};

// Bytes a run may be packed into for interleaved hashing (the rest goes on per chain).
constexpr std::size_t kMaxPackedBytes = 1 << 20;

}  // namespace

void chained_keys_many(std::size_t tokens_per_block, const KeyChainRun* runs, std::size_t count, KeyFormat format) {
  const std::size_t width = token_width(format);
  const std::size_t len = tokens_per_block * width;
  std::vector<PendingRun> pending;
  std::vector<std::size_t> paired(count, 0);      // leading full blocks of each run hashed interleaved
  std::vector<std::vector<std::uint8_t>> packed;  // those blocks in the format's encoding, where not already
  for (std::size_t i = 0; i < count; ++i) {
    const KeyChainRun& r = runs[i];
    const Tokens& t = *r.tokens;
    std::memcpy(r.out, r.parent.data(), r.parent.size());
    const std::size_t begin = r.first * tokens_per_block;
    std::size_t stop = std::min(t.count, (r.first + r.count) * tokens_per_block);
    const auto digest = std::lower_bound(t.digests.begin(), t.digests.end(), begin,
                                         [](const DigestToken& d, std::size_t pos) { return d.position < pos; });
    if (digest != t.digests.end()) stop = std::min(stop, digest->position);
    paired[i] = stop > begin ? (stop - begin) / tokens_per_block : 0;
    if (paired[i] == 0) continue;
    const std::uint8_t* data = t.data + begin * width;
    if (t.width != width || !t.contiguous()) {
      // Packed up to kMaxPackedBytes a run: a batch of huge 8-byte inputs must not double its memory.
      paired[i] = std::min(paired[i], std::max<std::size_t>(1, kMaxPackedBytes / len));
      packed.emplace_back(paired[i] * len);
      t.pack(begin, begin + paired[i] * tokens_per_block, width, packed.back().data());
      data = packed.back().data();
    }
    pending.push_back({data, r.out + 32, paired[i]});
  }

  // Up to four runs in flight, hashed in lock step (four at a time, else two, else one); when one
  // ends the next pending run takes its slot, so chains of unequal lengths still group up (every
  // block has the same length, so any runs can).
  constexpr std::size_t kLanes = 4;
  PendingRun slot[kLanes];
  std::size_t live = 0, next = 0;  // slots [0, live) hold runs; pending[next..] wait
  while (true) {
    while (live < kLanes && next < pending.size()) slot[live++] = pending[next++];
    if (live == 0) break;
    const std::size_t lanes = live >= 4 ? 4 : live >= 2 ? 2 : 1;
    std::size_t k = slot[0].n;
    for (std::size_t i = 1; i < lanes; ++i) k = std::min(k, slot[i].n);
    sha256::Chain chains[kLanes];
    for (std::size_t i = 0; i < lanes; ++i) chains[i] = {slot[i].out - 32, slot[i].data, slot[i].out};
    if (lanes == 4)
      sha256::chain_keys4(chains, len, k);
    else if (lanes == 2)
      sha256::chain_keys2(chains, len, k);
    else
      sha256::chain_keys(chains[0].parent, chains[0].data, len, k, chains[0].out);
    std::size_t kept = 0;
    for (std::size_t i = 0; i < live; ++i) {
      if (i < lanes) {
        slot[i].data += k * len;
        slot[i].out += 32 * k;
        slot[i].n -= k;
      }
      if (slot[i].n != 0) slot[kept++] = slot[i];
    }
    live = kept;
  }

  // The rest of each run, from its last paired key, exactly as chained_keys goes on.
  for (std::size_t i = 0; i < count; ++i) {
    const KeyChainRun& r = runs[i];
    if (paired[i] == r.count) continue;
    std::uint8_t* at = r.out + 32 * paired[i];
    Digest parent;
    std::memcpy(parent.data(), at, parent.size());
    chained_keys(parent, *r.tokens, r.first + paired[i], r.count - paired[i], tokens_per_block, format, at);
  }
}

void block_keys_many(std::size_t tokens_per_block, const KeyChainInput* inputs, std::size_t count, KeyFormat format) {
  std::vector<KeyChainRun> runs;
  runs.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    runs.push_back({root_key(inputs[i].scope), inputs[i].tokens, 0, ceil_div(inputs[i].tokens->count, tokens_per_block),
                    inputs[i].out});
  }
  chained_keys_many(tokens_per_block, runs.data(), runs.size(), format);
}

BlockKeyIterator::BlockKeyIterator(std::size_t tokens_per_block, const ReuseScope& scope, Tokens tokens,
                                   KeyFormat format)
    : tokens_per_block_(tokens_per_block), tokens_(std::move(tokens)), hasher_(format), key_(root_key(scope)) {}

Digest BlockKeyIterator::next(std::size_t& begin, std::size_t& end) noexcept {
  begin = end = next_;
  if (!started_) {
    started_ = true;
    return key_;
  }
  end = tokens_.count - begin < tokens_per_block_ ? tokens_.count : begin + tokens_per_block_;
  hasher_.begin(key_);
  hasher_.write(tokens_, begin, end, digest_);
  key_ = hasher_.finish();
  next_ = end;
  return key_;
}

}  // namespace kvcore
