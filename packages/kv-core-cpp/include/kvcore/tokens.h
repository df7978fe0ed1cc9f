// Token ids as the caller holds them: a view of a native buffer (read in place, any
// stride) or storage packed from Python objects, plus the multimodal digest tokens; mirrors
// tokens.py.
//
// A Tokens view borrows the buffer it reads: the caller keeps it alive while the view is used.
// Packed, its `data` points into its own `owned`, so it is moved, not copied (a copy would read
// the source's storage). A TokenList owns its ids. Both are plain values with no lock: one
// thread's at a time, or shared read-only; the functions touch nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvcore/constants.h"
#include "kvcore/sha256.h"

namespace kvcore {

KeyFormat parse_key_format(std::string_view name);  // throws Error(kValue) for unknown names
const char* key_format_name(KeyFormat format) noexcept;
inline std::size_t token_width(KeyFormat format) noexcept { return format == KeyFormat::kU32 ? 4 : 8; }

struct DigestToken {
  std::size_t position;
  Digest digest;
};

struct Tokens {
  const std::uint8_t* data = nullptr;  // item 0; items are little-endian integers
  std::size_t count = 0;
  std::ptrdiff_t stride = 4;  // bytes from one item to the next (may be negative)
  std::uint8_t width = 4;     // item size: 4 or 8 bytes
  bool is_signed = false;
  std::vector<DigestToken> digests;  // sorted by position; their items in `data` are ignored
  std::vector<std::uint8_t> owned;   // backing store when the ids were packed, not viewed

  bool contiguous() const noexcept { return stride == static_cast<std::ptrdiff_t>(width); }
  // Item i as an unsigned 64-bit value (sign-extended first for signed items).
  std::uint64_t raw(std::size_t i) const noexcept;
  // Items [begin, end) as raw() reads them, as `width`-byte (4 or 8) little-endian integers into
  // `out` (low bytes kept): one typed loop, not a call per item (the hasher's packing).
  void pack(std::size_t begin, std::size_t end, std::size_t width, std::uint8_t* out) const noexcept;
  std::string value_text(std::size_t i) const;  // item i in decimal, as Python would print it

  const Digest* digest_at(std::size_t i) const noexcept;  // the digest token at i, if any
  // Throws Error(kValue) naming the first id outside the format's range.
  void validate(KeyFormat format) const;
  // A copy that owns its ids (contiguous, `format` width) so it can outlive the source buffer.
  Tokens to_owned(KeyFormat format) const;
};

// An allocator whose construct() with no value default-initialises: a vector of ids grown by
// resize() is not zeroed first, as every id is written right after (a prefill's ids are a
// pass over memory of their own).
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() noexcept = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}  // NOLINT: rebinding converts implicitly
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// Validated tokens the manager keeps (committed tokens, block tokens): ids, with 0 at the
// positions of digest tokens, plus those digests.
struct TokenList {
  std::vector<std::uint64_t, UninitializedAllocator<std::uint64_t>> ids;
  std::vector<DigestToken> digests;  // sorted by position

  static TokenList from(const Tokens& tokens, std::size_t begin, std::size_t end);
  std::size_t size() const noexcept { return ids.size(); }
  std::uint64_t raw(std::size_t i) const noexcept { return ids[i]; }  // 0 at a digest token
  const Digest* digest_at(std::size_t i) const noexcept;
  std::size_t first_digest_at_or_after(std::size_t i) const noexcept;  // index into digests
  TokenList slice(std::size_t begin, std::size_t end) const;
  // Makes `out` tokens [begin, end) of this list, reusing out's storage.
  void slice_into(std::size_t begin, std::size_t end, TokenList& out) const;
  void append(const TokenList& other);
  void append(const Tokens& src, std::size_t begin, std::size_t end);  // tokens [begin, end) of src
  // A Tokens view (8-byte ids) for the hasher; valid while this list is unchanged.
  Tokens view() const;
};

// "token 3: id -1 out of range for sha256-u32 (0 <= id < 2**31)", shared with the bindings.
std::string token_out_of_range(std::size_t position, const std::string& value, KeyFormat format);

}  // namespace kvcore
