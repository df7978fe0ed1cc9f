#include "kvcore/tokens.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <type_traits>

#include "kvcore/error.h"

namespace kvcore {

KeyFormat parse_key_format(std::string_view name) {
  std::string expected;
  for (std::size_t i = 0; i < std::size(kKeyFormatNames); ++i) {
    if (name == kKeyFormatNames[i]) return static_cast<KeyFormat>(i);
    expected += (i ? ", " : "") + std::string(kKeyFormatNames[i]);
  }
  throw Error(ErrorKind::kValue, "key_format: unknown '" + std::string(name) + "' (expected one of " + expected + ")");
}

const char* key_format_name(KeyFormat format) noexcept { return kKeyFormatNames[static_cast<std::size_t>(format)]; }

std::string token_out_of_range(std::size_t position, const std::string& value, KeyFormat format) {
  return "token " + std::to_string(position) + ": id " + value + " out of range for " + key_format_name(format) +
         (format == KeyFormat::kU32 ? " (0 <= id < 2**31)" : " (0 <= id < 2**64)");
}

namespace {

template <typename T>
T load(const std::uint8_t* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Index of the first id of type T outside [0, limit), or count. Compared as unsigned, so a
// negative id is a huge one; the contiguous loop is branch-free and vectorises.
template <typename T>
std::size_t first_bad(const Tokens& t, std::uint64_t limit) {
  using U = std::make_unsigned_t<T>;
  const std::uint64_t sign_limit = std::uint64_t{1} << (8 * sizeof(T) - 1);
  const U ulimit = static_cast<U>(std::is_signed_v<T> && limit > sign_limit ? sign_limit : limit);
  const std::uint8_t* p = t.data;
  if (t.contiguous()) {
    const std::size_t block = 4096;
    for (std::size_t start = 0; start < t.count; start += block) {
      const std::size_t end = start + block < t.count ? start + block : t.count;
      U bad = 0;
      for (std::size_t i = start; i < end; ++i) bad |= static_cast<U>(load<U>(p + i * sizeof(U)) >= ulimit);
      if (bad) {
        for (std::size_t i = start; i < end; ++i) {
          if (load<U>(p + i * sizeof(U)) >= ulimit) return i;
        }
      }
    }
    return t.count;
  }
  for (std::size_t i = 0; i < t.count; ++i) {
    if (load<U>(p + static_cast<std::ptrdiff_t>(i) * t.stride) >= ulimit) return i;
  }
  return t.count;
}

// Items [begin, end) as Tokens::raw reads them, cut to `Out` (the low bytes), into `out`.
template <typename T, typename Out>
void narrow(const Tokens& t, std::size_t begin, std::size_t end, std::uint8_t* out) {
  using Wide = std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>;
  const std::uint8_t* p = t.data;
  if (t.contiguous()) {  // a fixed stride: the loop vectorises
    for (std::size_t i = begin; i < end; ++i) {
      const auto v = static_cast<Out>(static_cast<Wide>(load<T>(p + i * sizeof(T))));
      std::memcpy(out + (i - begin) * sizeof(Out), &v, sizeof(Out));  // little-endian host
    }
    return;
  }
  for (std::size_t i = begin; i < end; ++i) {
    const auto v = static_cast<Out>(static_cast<Wide>(load<T>(p + static_cast<std::ptrdiff_t>(i) * t.stride)));
    std::memcpy(out + (i - begin) * sizeof(Out), &v, sizeof(Out));
  }
}

template <typename Out>
void narrow_to(const Tokens& t, std::size_t begin, std::size_t end, std::uint8_t* out) {
  if (t.width == 4) {
    if (t.is_signed) {
      narrow<std::int32_t, Out>(t, begin, end, out);
    } else {
      narrow<std::uint32_t, Out>(t, begin, end, out);
    }
  } else if (t.is_signed) {
    narrow<std::int64_t, Out>(t, begin, end, out);
  } else {
    narrow<std::uint64_t, Out>(t, begin, end, out);
  }
}

}  // namespace

void Tokens::pack(std::size_t begin, std::size_t end, std::size_t out_width, std::uint8_t* out) const noexcept {
  if (out_width == 4) {
    narrow_to<std::uint32_t>(*this, begin, end, out);
  } else {
    narrow_to<std::uint64_t>(*this, begin, end, out);
  }
}

std::uint64_t Tokens::raw(std::size_t i) const noexcept {
  const std::uint8_t* p = data + static_cast<std::ptrdiff_t>(i) * stride;
  if (width == 4) {
    return is_signed ? static_cast<std::uint64_t>(static_cast<std::int64_t>(load<std::int32_t>(p)))
                     : load<std::uint32_t>(p);
  }
  return load<std::uint64_t>(p);
}

std::string Tokens::value_text(std::size_t i) const {
  const std::uint64_t v = raw(i);
  return is_signed ? std::to_string(static_cast<std::int64_t>(v)) : std::to_string(v);
}

void Tokens::validate(KeyFormat format) const {
  if (format == KeyFormat::kU64 && !is_signed) return;  // every u64 is in range
  // Signed items only need to be >= 0 for u64; digest placeholders are 0, always valid.
  const std::uint64_t limit = format == KeyFormat::kU32 ? (1ull << 31) : ~0ull;
  std::size_t bad;
  if (width == 4) {
    bad = is_signed ? first_bad<std::int32_t>(*this, limit) : first_bad<std::uint32_t>(*this, limit);
  } else {
    bad = is_signed ? first_bad<std::int64_t>(*this, limit) : first_bad<std::uint64_t>(*this, limit);
  }
  if (bad != count) throw Error(ErrorKind::kValue, token_out_of_range(bad, value_text(bad), format));
}

Tokens Tokens::to_owned(KeyFormat format) const {
  Tokens out;
  out.width = static_cast<std::uint8_t>(token_width(format));
  out.stride = out.width;
  out.count = count;
  out.digests = digests;
  out.owned.resize(count * out.width);
  pack(0, count, out.width, out.owned.data());  // validated: every id fits the format's width
  out.data = out.owned.data();
  return out;
}

const Digest* Tokens::digest_at(std::size_t i) const noexcept {
  const auto it = std::lower_bound(digests.begin(), digests.end(), i,
                                   [](const DigestToken& d, std::size_t pos) { return d.position < pos; });
  return it != digests.end() && it->position == i ? &it->digest : nullptr;
}

TokenList TokenList::from(const Tokens& tokens, std::size_t begin, std::size_t end) {
  TokenList out;
  out.append(tokens, begin, end);
  return out;
}

void TokenList::append(const Tokens& src, std::size_t begin, std::size_t end) {
  const std::size_t base = ids.size(), size = base + (end - begin);
  // A cache's prefill is followed by its decode, a token at a time: an eighth more room, so that
  // the first decoded token does not move the whole prompt.
  if (size > ids.capacity()) ids.reserve(size + size / 8);
  ids.resize(size);
  // One typed loop (a cached prompt's whole matched prefix comes through here).
  src.pack(begin, end, sizeof(std::uint64_t), reinterpret_cast<std::uint8_t*>(ids.data() + base));
  for (const DigestToken& d : src.digests) {
    if (d.position >= begin && d.position < end) {
      digests.push_back({base + d.position - begin, d.digest});
      ids[base + d.position - begin] = 0;
    }
  }
}

std::size_t TokenList::first_digest_at_or_after(std::size_t i) const noexcept {
  std::size_t lo = 0, hi = digests.size();
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (digests[mid].position < i) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

const Digest* TokenList::digest_at(std::size_t i) const noexcept {
  const std::size_t k = first_digest_at_or_after(i);
  return k < digests.size() && digests[k].position == i ? &digests[k].digest : nullptr;
}

TokenList TokenList::slice(std::size_t begin, std::size_t end) const {
  TokenList out;
  slice_into(begin, end, out);
  return out;
}

void TokenList::slice_into(std::size_t begin, std::size_t end, TokenList& out) const {
  out.ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(begin), ids.begin() + static_cast<std::ptrdiff_t>(end));
  out.digests.clear();
  for (std::size_t k = first_digest_at_or_after(begin); k < digests.size() && digests[k].position < end; ++k) {
    out.digests.push_back({digests[k].position - begin, digests[k].digest});
  }
}

void TokenList::append(const TokenList& other) {
  const std::size_t base = ids.size();
  ids.insert(ids.end(), other.ids.begin(), other.ids.end());
  for (const DigestToken& d : other.digests) digests.push_back({d.position + base, d.digest});
}

Tokens TokenList::view() const {
  Tokens t;
  t.data = reinterpret_cast<const std::uint8_t*>(ids.data());
  t.count = ids.size();
  t.width = 8;
  t.stride = 8;
  t.is_signed = false;
  t.digests = digests;
  return t;
}

}  // namespace kvcore
