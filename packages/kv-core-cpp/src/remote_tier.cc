// The remote tier (remote_tier.py): fetching a match's continuation from the store, checking
// each value, placing its pages on the last local level, and writing committed blocks through.
#include "kvcore/remote_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kvcore/constants.h"
#include "kvcore/crc32.h"
#include "kvcore/error.h"

namespace kvcore {

namespace {

// kv_api.block_value's header: magic, version, header size, fingerprint, key, parent key,
// prefix tokens, block tokens, layer groups; then one length per layer group, the CRC-32 of the
// header before it and the CRC-32 of the payload.
constexpr char kMagic[4] = {'K', 'V', 'C', 'B'};
constexpr std::uint64_t kVersion = 2;
constexpr std::size_t kFingerprintAt = 8;
constexpr std::size_t kKeyAt = 40;
constexpr std::size_t kParentAt = 72;
constexpr std::size_t kPrefixAt = 104;
constexpr std::size_t kTokensAt = 112;
constexpr std::size_t kGroupsAt = 116;
constexpr std::size_t kFixed = 120;  // everything before the lengths
constexpr std::size_t kDigest = 32;  // the fingerprint's and the keys' size
constexpr std::size_t kChecksums = 8;

std::uint64_t header_size(std::uint64_t num_layer_groups) { return kFixed + 8 * num_layer_groups + kChecksums; }

// What flush() stages before it hands the store a put (remote_tier.py's twins).
constexpr std::size_t kHandBlocks = 16;
constexpr std::size_t kHandBytes = std::size_t{1} << 20;

// Little-endian fields whatever the host's order: values cross machines.
std::uint64_t read_le(const std::uint8_t* at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes; i-- > 0;) v = (v << 8) | at[i];
  return v;
}

void write_le(std::uint8_t* at, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i, v >>= 8) at[i] = static_cast<std::uint8_t>(v & 0xFF);
}

std::uint32_t header_crc(const std::uint8_t* value, std::uint64_t header) {
  return crc32(0, value, header - kChecksums);
}

std::uint32_t payload_crc(const std::uint8_t* value, std::uint64_t header, std::uint64_t size) {
  return crc32(0, value + header, size - header);
}

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

RemoteTier::RemoteTier(const RemoteTierConfig& tier, const KVCacheManagerConfig& config, CacheContext& context,
                       BlockStore& store)
    : store_(store),
      namespace_(tier.store_namespace),
      fingerprint_(tier.fingerprint),
      tokens_per_block_(config.tokens_per_block),
      context_(context),
      registry_(context.registry()),
      storage_(context.storage()),
      tree_(context.tree()),
      events_(context.events()),
      level_(context.storage().last_level()) {
  const std::size_t num_groups = registry_.size();
  header_ = header_size(num_groups);
  std::uint64_t at = header_;
  for (std::size_t g = 0; g < num_groups; ++g) {
    const PoolGroup& group = storage_.level(0).pool_groups[storage_.config().pool_group_of(static_cast<int>(g))];
    std::uint64_t size = 0;
    for (std::uint64_t s : group.slot_sizes) size += s;
    page_sizes_.push_back(size);
    page_offsets_.push_back(at);
    at += size;
  }
  value_size_ = at;
  // A block leaving the tree is never written: its pointer may name another block once recycled.
  tree_.on_remove = [this](const Block* block) {
    if (block == nullptr) {
      pending_.clear();
    } else if (!pending_.empty()) {
      pending_.erase(std::remove(pending_.begin(), pending_.end(), block), pending_.end());
    }
  };
}

RemoteTier::~RemoteTier() { tree_.on_remove = nullptr; }

std::string RemoteTier::store_key(const Digest& key) const {
  std::string out = namespace_;
  out.append(reinterpret_cast<const char*>(key.data()), key.size());
  return out;
}

std::int64_t RemoteTier::checked_count(std::int64_t answer, std::size_t n) {
  if (answer < 0 || answer > static_cast<std::int64_t>(n)) {
    context_.count(&CacheStats::remote_errors, 1);
    return 0;
  }
  return answer;
}

// -- reading --------------------------------------------------------------------------------------

std::vector<Block*> RemoteTier::fetch(Node* parent, const Digest& parent_key, const std::vector<Digest>& keys,
                                      std::int64_t first, const TokenList& tokens, const PageSet& keep,
                                      const ReuseScope& scope) {
  context_.count(&CacheStats::remote_lookups, 1);
  const std::int64_t n = checked_count(store_.contains({namespace_, keys.data(), keys.size()}), keys.size());
  if (n == 0) return {};
  std::vector<std::uint8_t> buffer(static_cast<std::size_t>(n) * value_size_, 0);
  std::vector<ValueBuffer> views;
  for (std::int64_t i = 0; i < n; ++i) views.push_back({buffer.data() + i * value_size_, value_size_});
  const auto found = static_cast<std::size_t>(n);
  const std::int64_t got = checked_count(store_.get_into({namespace_, keys.data(), found}, views), found);
  std::int64_t accepted = 0;
  const Digest* previous = &parent_key;
  for (std::int64_t i = 0; i < got; ++i) {
    if (!valid(views[i].data, keys[i], *previous, first + i)) {
      context_.count(&CacheStats::remote_rejected, 1);
      break;
    }
    if (!complete(views[i].data, first + i)) break;
    previous = &keys[i];
    ++accepted;
  }
  if (accepted == 0) return {};
  const std::vector<std::vector<Page*>> placed = place(buffer.data(), first, accepted, keep);
  if (placed.empty()) return {};
  Node* node = parent == nullptr ? tree_.root(parent_key, scope) : parent;
  std::vector<Block*> blocks;
  for (std::size_t i = 0; i < placed.size(); ++i) {
    node = add(node, keys[i], tokens, first + static_cast<std::int64_t>(i), placed[i], scope.lora_id);
    blocks.push_back(static_cast<Block*>(node));
  }
  context_.count(&CacheStats::remote_blocks, blocks.size());
  return blocks;
}

std::uint64_t RemoteTier::length(const std::uint8_t* value, std::size_t layer_group) const {
  return read_le(value + kFixed + 8 * layer_group, 8);
}

bool RemoteTier::valid(const std::uint8_t* value, const Digest& key, const Digest& parent, std::int64_t ordinal) const {
  // kv_api.block_value.read_header's checks (the buffer is value_size_ long), then the manager's.
  const std::uint64_t groups = read_le(value + kGroupsAt, 4);
  if (std::memcmp(value, kMagic, 4) != 0 || read_le(value + 4, 2) != kVersion ||
      read_le(value + 6, 2) != header_size(groups) || value_size_ < header_size(groups)) {
    return false;
  }
  if (groups != page_sizes_.size()) return false;
  if (read_le(value + header_ - kChecksums, 4) != header_crc(value, header_)) return false;
  if (std::memcmp(value + kFingerprintAt, fingerprint_.data(), kDigest) != 0 ||
      std::memcmp(value + kKeyAt, key.data(), kDigest) != 0 ||
      std::memcmp(value + kParentAt, parent.data(), kDigest) != 0) {
    return false;
  }
  const auto tpb = static_cast<std::uint64_t>(tokens_per_block_);
  if (read_le(value + kTokensAt, 4) != tpb ||
      read_le(value + kPrefixAt, 8) != static_cast<std::uint64_t>(ordinal + 1) * tpb)
    return false;
  for (std::size_t g = 0; g < page_sizes_.size(); ++g) {
    const std::uint64_t n = length(value, g);
    if (n != 0 && n != page_sizes_[g]) return false;
  }
  return read_le(value + header_ - kChecksums + 4, 4) == payload_crc(value, header_, value_size_);
}

bool RemoteTier::complete(const std::uint8_t* value, std::int64_t ordinal) const {
  // A page in every layer group whose loss would cut the chain there.
  for (std::size_t g = 0; g < page_sizes_.size(); ++g) {
    if (length(value, g) == 0 && registry_.kind(static_cast<int>(g)).drop_takes_subtree(ordinal)) return false;
  }
  return true;
}

std::vector<std::vector<bool>> RemoteTier::kept(const std::uint8_t* buffer, std::int64_t first,
                                                std::int64_t count) const {
  // Every page a chain needs, and the others not stale at the last block's end (window pages
  // before the window, SSM snapshots before the last block are no use).
  const std::int64_t end = (first + count) * tokens_per_block_;
  std::vector<std::pair<std::int64_t, std::int64_t>> stale;
  for (std::size_t g = 0; g < page_sizes_.size(); ++g) stale.push_back(registry_.stale_range(static_cast<int>(g), end));
  std::vector<std::vector<bool>> out;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint8_t* value = buffer + i * value_size_;
    const std::int64_t ordinal = first + i;
    std::vector<bool>& row = out.emplace_back();
    for (std::size_t g = 0; g < page_sizes_.size(); ++g) {
      const LifeCycleKind& kind = registry_.kind(static_cast<int>(g));
      const bool fresh = !(stale[g].first <= ordinal && ordinal < stale[g].second);
      row.push_back(length(value, g) != 0 && (kind.drop_takes_subtree(ordinal) || fresh) &&
                    (kind.has_block_pages() || i == count - 1));
    }
  }
  return out;
}

std::vector<std::vector<Page*>> RemoteTier::place(const std::uint8_t* buffer, std::int64_t first, std::int64_t count,
                                                  const PageSet& keep) {
  // As many values as room can be made for without evicting `keep` (halving).
  while (count) {
    const std::vector<std::vector<bool>> rows = kept(buffer, first, count);
    std::vector<std::uint64_t> need(storage_.pool_groups().size(), 0);
    for (const std::vector<bool>& row : rows) {
      for (std::size_t g = 0; g < row.size(); ++g) need[storage_.config().pool_group_of(static_cast<int>(g))] += row[g];
    }
    try {
      storage_.make_room(level_, need, keep);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kOutOfPages) throw;
      count /= 2;
      continue;
    }
    return fill(buffer, rows, need);
  }
  return {};
}

std::vector<std::vector<Page*>> RemoteTier::fill(const std::uint8_t* buffer, const std::vector<std::vector<bool>>& kept,
                                                 const std::vector<std::uint64_t>& need) {
  // New pages on the last local level (room made) for the kept pages, their bytes copied in.
  std::vector<std::vector<std::uint64_t>> slots;
  CacheLevel& level = storage_.level(level_);
  for (std::size_t pg = 0; pg < need.size(); ++pg) slots.push_back(level.pool_groups[pg].allocate(need[pg]));
  std::vector<std::size_t> next(need.size(), 0);
  std::vector<std::vector<Page*>> pages;
  std::vector<ImportPage> copies;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    std::vector<Page*>& placed = pages.emplace_back(kept[i].size(), nullptr);
    for (std::size_t g = 0; g < kept[i].size(); ++g) {
      if (!kept[i][g]) continue;
      const int pg = storage_.config().pool_group_of(static_cast<int>(g));
      const std::uint64_t slot = slots[pg][next[pg]++];
      placed[g] = storage_.new_page_at(level_, static_cast<int>(g), slot, kDefaultPriority);
      copies.push_back({pg, slot, i * value_size_ + page_offsets_[g]});
    }
  }
  const auto release = [&] {
    for (const std::vector<Page*>& placed : pages) {
      for (Page* page : placed) {
        if (page != nullptr) storage_.free_new(page);
      }
    }
  };
  try {
    storage_.transfer().import_pages(level_, copies, buffer);
  } catch (const Error& e) {
    release();
    if (e.kind() != ErrorKind::kOS && e.kind() != ErrorKind::kDiskOOM) throw;
    context_.count(&CacheStats::remote_errors, 1);
    return {};
  } catch (...) {
    release();  // the copier's error: no slot kept for pages that never were
    throw;
  }
  return pages;
}

Block* RemoteTier::add(Node* parent, const Digest& key, const TokenList& tokens, std::int64_t ordinal,
                       const std::vector<Page*>& pages, std::optional<std::uint64_t> lora) {
  // A partial sibling the block extends gives way to it.
  const auto begin = static_cast<std::size_t>(ordinal * tokens_per_block_);
  const std::size_t end = begin + static_cast<std::size_t>(tokens_per_block_);
  Block* shorter = parent->children().empty() ? nullptr : RadixTree::covered_sibling(parent, tokens.slice(begin, end));
  Block* block = tree_.add(parent, key, tokens, begin, end, ordinal);
  if (shorter != nullptr) storage_.adopt(block, shorter);
  for (std::size_t g = 0; g < pages.size(); ++g) {
    Page* page = pages[g];
    if (page == nullptr) continue;
    if (Page* old = block->pages[g]) storage_.orphan(old);
    page->block = block;
    page->num_tokens = tokens_per_block_;
    block->pages[g] = page;
    storage_.settle(page);
    if (events_ != nullptr) events_->stored(block, static_cast<int>(g), page->priority, page->level, lora);
  }
  return block;
}

// -- writing --------------------------------------------------------------------------------------

bool RemoteTier::writable(const Block* block) const {
  // Still in the tree, with every page a reader needs (complete()'s rule).
  if (block->parent == nullptr || block->parent->child(block->key) != block) return false;
  for (std::size_t g = 0; g < block->pages.size(); ++g) {
    if (block->pages[g] == nullptr && registry_.kind(static_cast<int>(g)).drop_takes_subtree(block->ordinal))
      return false;
  }
  return true;
}

void RemoteTier::encode(const Block* block, std::uint8_t* value) const {
  std::memcpy(value, kMagic, 4);
  write_le(value + 4, kVersion, 2);
  write_le(value + 6, header_, 2);
  std::memcpy(value + kFingerprintAt, fingerprint_.data(), kDigest);
  std::memcpy(value + kKeyAt, block->key.data(), kDigest);
  std::memcpy(value + kParentAt, block->parent->key.data(), kDigest);
  write_le(value + kPrefixAt, static_cast<std::uint64_t>((block->ordinal + 1) * tokens_per_block_), 8);
  write_le(value + kTokensAt, static_cast<std::uint64_t>(tokens_per_block_), 4);
  write_le(value + kGroupsAt, page_sizes_.size(), 4);
  for (std::size_t g = 0; g < page_sizes_.size(); ++g) {
    write_le(value + kFixed + 8 * g, block->pages[g] == nullptr ? 0 : page_sizes_[g], 8);
  }
  write_le(value + header_ - kChecksums, header_crc(value, header_), 4);
  write_le(value + header_ - kChecksums + 4, payload_crc(value, header_, value_size_), 4);
}

void RemoteTier::flush() {
  if (batches_ > 0) return;
  std::vector<Block*> blocks;
  blocks.swap(pending_);
  blocks.erase(std::remove_if(blocks.begin(), blocks.end(), [this](const Block* b) { return !writable(b); }),
               blocks.end());
  if (blocks.empty()) return;
  if (paused_until_ > 0 && monotonic_seconds() < paused_until_) {
    context_.count(&CacheStats::remote_skipped, blocks.size());  // the store would drop them: none encoded
    return;
  }
  const std::size_t at = staged_.size();
  staged_.resize(at + blocks.size() * value_size_, 0);  // zeros where a layer group has no page
  std::vector<ExportPage> sources;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    for (std::size_t g = 0; g < page_sizes_.size(); ++g) {
      if (const Page* page = blocks[i]->pages[g])
        sources.push_back({static_cast<int>(page->level), storage_.pool_group(page), page->slot,
                           at + i * value_size_ + page_offsets_[g]});
    }
  }
  // A page read from disk that failed its checksum: nothing written this call.
  if (!storage_.transfer().export_pages(sources, staged_.data()).empty()) {
    staged_.resize(at);
    return;
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    encode(blocks[i], staged_.data() + at + i * value_size_);
    staged_keys_.push_back(store_key(blocks[i]->key));
  }
  if (staged_keys_.size() >= kHandBlocks || staged_.size() >= kHandBytes) hand();
}

void RemoteTier::hand() {
  if (staged_keys_.empty()) return;
  const std::size_t n = staged_keys_.size();
  const double pause = store_.put(staged_keys_, staged_.data(), value_size_);
  staged_keys_.clear();
  staged_.clear();
  if (staged_.capacity() > 2 * kHandBytes) std::vector<std::uint8_t>().swap(staged_);  // a prefill's: not kept
  if (pause < 0) {  // a write not made, never the commit's error
    context_.count(&CacheStats::remote_errors, 1);
    return;
  }
  context_.count(&CacheStats::remote_written, n);
  paused_until_ = pause > 0 ? monotonic_seconds() + pause : 0;
}

}  // namespace kvcore
