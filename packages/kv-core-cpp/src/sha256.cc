// SHA-256 streaming hasher and runtime selection of the block transform.

#include "kvcore/sha256.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "sha256_transforms.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

// The transforms and the padding below assume little-endian hosts; the SIMD
// byte-swaps in particular would be wrong on big-endian.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "kvcore SHA-256 supports little-endian targets only"
#endif

namespace kvcore {
namespace sha256 {
namespace {

// Every name the API knows, in preference order (last = best); used to tell
// "unknown name" apart from "known but unavailable here".
constexpr const char* kKnownNames[] = {"portable", "shani", "armv8"};

// Static storage so active() can hand out stable references.
const Transform kPortable{"portable",       &transform_portable,  &chain_portable, &transform2_portable,
                          &chain2_portable, &transform4_portable, &chain4_portable};
#if defined(KVCORE_HAVE_SHANI)
const Transform kShani{"shani",       &transform_shani,  &chain_shani, &transform2_shani,
                       &chain2_shani, &transform4_shani, &chain4_shani};
#endif
#if defined(KVCORE_HAVE_ARMV8)
const Transform kArmv8{"armv8",       &transform_armv8,  &chain_armv8, &transform2_armv8,
                       &chain2_armv8, &transform4_armv8, &chain4_armv8};
#endif

#if defined(KVCORE_HAVE_SHANI)
bool cpu_has_shani() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // Leaf 7 subleaf 0, EBX bit 29: SHA extensions.
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(ebx & (1u << 29))) return false;
  // Leaf 1, ECX bit 19: SSE4.1 (the transform uses blend/alignr/pshufb).
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 19))) return false;
  return true;
}
#endif

#if defined(KVCORE_HAVE_ARMV8)
bool cpu_has_armv8_sha2() {
#if defined(__linux__)
  return (getauxval(AT_HWCAP) & HWCAP_SHA2) != 0;
#elif defined(__APPLE__)
  return true;  // every Apple arm64 core implements the SHA-2 instructions
#else
  return false;  // no portable way to ask; stay safe
#endif
}
#endif

// Transforms usable on this machine, portable first, best last.
std::vector<const Transform*> usable() {
  std::vector<const Transform*> out{&kPortable};
#if defined(KVCORE_HAVE_SHANI)
  if (cpu_has_shani()) out.push_back(&kShani);
#endif
#if defined(KVCORE_HAVE_ARMV8)
  if (cpu_has_armv8_sha2()) out.push_back(&kArmv8);
#endif
  return out;
}

bool compiled_in(const std::string& name) {
  if (name == "portable") return true;
#if defined(KVCORE_HAVE_SHANI)
  if (name == "shani") return true;
#endif
#if defined(KVCORE_HAVE_ARMV8)
  if (name == "armv8") return true;
#endif
  return false;
}

std::string join_available() {
  std::string s;
  for (const Transform* t : usable()) {
    if (!s.empty()) s += ", ";
    s += t->name;
  }
  return s;
}

// Resolves a name or throws std::invalid_argument saying why it is unusable.
// `what` prefixes the message (e.g. "KVCORE_SHA256=armv8").
const Transform& lookup(const std::string& name, const std::string& what) {
  for (const Transform* t : usable())
    if (name == t->name) return *t;

  bool known = false;
  for (const char* k : kKnownNames) known = known || name == k;
  if (!known)
    throw std::invalid_argument(
        what + ": unknown transform (known: portable, shani, armv8; available: " + join_available() + ")");
  const char* reason = compiled_in(name) ? "not supported by this CPU" : "not compiled into this build";
  throw std::invalid_argument(what + ": transform not available on this machine (" + reason +
                              "; available: " + join_available() + ")");
}

// Plain (unfused) SHA-256 of a message shorter than 256 bytes using fn; the
// reference for the chain self-test. Sha256 cannot be used there: its
// constructor calls active(), which may be what is running the self-test.
void digest_with(TransformFn fn, const std::uint8_t* msg, std::size_t len, std::uint8_t out[32]) {
  std::uint32_t st[8];
  std::memcpy(st, detail::kInitialHash, sizeof st);
  const std::size_t full = len / 64, r = len % 64;
  fn(st, msg, full);
  std::uint8_t tail[128] = {};
  std::memcpy(tail, msg + 64 * full, r);
  tail[r] = 0x80;
  const std::size_t blocks = r <= 55 ? 1 : 2;
  const std::uint64_t bits = static_cast<std::uint64_t>(len) * 8;
  for (int i = 0; i < 8; ++i) tail[64 * blocks - 8 + i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
  fn(st, tail, blocks);
  for (int w = 0; w < 8; ++w)
    for (int b = 0; b < 4; ++b) out[4 * w + b] = static_cast<std::uint8_t>(st[w] >> (24 - 8 * b));
}

// Checks t.chain against digest_with(t.fn) (whose KATs already passed) for n
// keys of len bytes: exercises the hand-over of the state between keys, the
// direct data loads and the tail/padding buffer.
bool chain_matches(const Transform& t, std::size_t len, std::size_t n) {
  std::uint8_t data[3 * 128 + 1];
  for (std::size_t i = 0; i < sizeof data; ++i) data[i] = static_cast<std::uint8_t>(i * 131 + 7);
  std::uint8_t parent[32];
  for (std::size_t i = 0; i < 32; ++i) parent[i] = static_cast<std::uint8_t>(0xa5 ^ i);

  std::uint8_t got[3 * 32], msg[32 + 128], want[32];
  t.chain(parent, data + 1, len, n, got);  // odd address: the kernels must not assume alignment
  const std::uint8_t* prev = parent;
  for (std::size_t i = 0; i < n; ++i) {
    std::memcpy(msg, prev, 32);
    std::memcpy(msg + 32, data + 1 + i * len, len);
    digest_with(t.fn, msg, 32 + len, want);
    if (std::memcmp(got + 32 * i, want, 32) != 0) return false;
    prev = got + 32 * i;
  }
  return true;
}

// Checks t.chain2 / t.chain4 against t.chain (checked just before) on different chains of n keys
// each, and t.fn2 / t.fn4 against t.fn on different 2-block messages.
bool interleaved_match(const Transform& t, std::size_t len, std::size_t n) {
  std::uint8_t data[4][3 * 128 + 1];
  std::uint8_t parent[4][32];
  for (std::size_t c = 0; c < 4; ++c) {
    for (std::size_t i = 0; i < sizeof data[c]; ++i) data[c][i] = static_cast<std::uint8_t>(i * (131 + 2 * c) + 7 * c);
    for (std::size_t i = 0; i < 32; ++i) parent[c][i] = static_cast<std::uint8_t>((0xa5 + c) ^ (i * (1 + 2 * c)));
  }
  std::uint8_t want[4][3 * 32];
  std::uint32_t want_state[4][8];
  for (std::size_t c = 0; c < 4; ++c) {
    t.chain(parent[c], data[c] + 1, len, n, want[c]);
    std::memcpy(want_state[c], parent[c], sizeof want_state[c]);  // any state will do; streams must differ
    t.fn(want_state[c], data[c] + 1, 2);
  }
  bool ok = true;
  for (std::size_t lanes : {std::size_t{2}, std::size_t{4}}) {
    std::uint8_t got[4][3 * 32] = {};
    std::uint32_t state[4][8];
    Chain chains[4];
    Stream streams[4];
    for (std::size_t c = 0; c < lanes; ++c) {
      chains[c] = {parent[c], data[c] + 1, got[c]};
      std::memcpy(state[c], parent[c], sizeof state[c]);
      streams[c] = {state[c], data[c] + 1};
    }
    (lanes == 2 ? t.chain2 : t.chain4)(chains, len, n);
    (lanes == 2 ? t.fn2 : t.fn4)(streams, 2);
    for (std::size_t c = 0; c < lanes; ++c)
      ok = ok && std::memcmp(got[c], want[c], 32 * n) == 0 && std::memcmp(state[c], want_state[c], 32) == 0;
  }
  return ok;
}

// Known-answer self-test, run on every transform before it is made active so
// a miscompiled or misdetected SIMD path fails loudly instead of producing
// wrong keys. Covers a single block and a multi-block call, then the fused
// chain (3 keys spanning 3 blocks each; 2 keys that fit one block each), then
// the interleaved kernels against the single-stream ones.
void self_test(const Transform& t) {
  static const std::uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  // SHA-256("abc"): one padded block.
  static const std::uint32_t kAbc[8] = {0xba7816bf, 0x8f01cfea, 0x414140de, 0x5dae2223,
                                        0xb00361a3, 0x96177a9c, 0xb410ff61, 0xf20015ad};
  // SHA-256 of the 448-bit "abcdbcde...nopq" message: two padded blocks.
  static const std::uint32_t kTwo[8] = {0x248d6a61, 0xd20638b8, 0xe5c02693, 0x0c3e6039,
                                        0xa33ce459, 0x64ff2167, 0xf6ecedd4, 0x19db06c1};

  std::uint8_t block[64] = {'a', 'b', 'c', 0x80};
  block[63] = 24;  // message length in bits
  std::uint32_t st[8];
  std::memcpy(st, kInit, sizeof st);
  t.fn(st, block, 1);
  bool ok = std::memcmp(st, kAbc, sizeof st) == 0;

  static const char kMsg[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  std::uint8_t two[128] = {};
  std::memcpy(two, kMsg, 56);
  two[56] = 0x80;
  two[126] = 0x01;  // 448 bits = 0x01c0
  two[127] = 0xc0;
  std::memcpy(st, kInit, sizeof st);
  t.fn(st, two, 2);
  ok = ok && std::memcmp(st, kTwo, sizeof st) == 0;
  ok = ok && chain_matches(t, 128, 3) && chain_matches(t, 5, 2);
  ok = ok && interleaved_match(t, 128, 3) && interleaved_match(t, 5, 2);

  if (!ok)
    throw std::runtime_error(std::string("kvcore sha256: known-answer self-test failed for transform '") + t.name +
                             "'");
}

std::mutex g_mutex;  // serialises first selection and select()
std::atomic<const Transform*> g_active{nullptr};

}  // namespace

std::vector<std::string> available() {
  std::vector<std::string> out;
  for (const Transform* t : usable()) out.emplace_back(t->name);
  return out;
}

const Transform& active() {
  // Fast path: one acquire load once selected.
  if (const Transform* t = g_active.load(std::memory_order_acquire)) return *t;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const Transform* t = g_active.load(std::memory_order_relaxed)) return *t;

  const Transform* chosen = usable().back();
  const char* env = std::getenv("KVCORE_SHA256");
  if (env != nullptr && *env != '\0') chosen = &lookup(env, std::string("KVCORE_SHA256=") + env);
  // On a throw nothing is stored, so a later call retries (and throws again).
  self_test(*chosen);
  g_active.store(chosen, std::memory_order_release);
  return *chosen;
}

void select(const std::string& name) {
  const Transform& t = lookup(name, "kvcore::sha256::select(\"" + name + "\")");
  std::lock_guard<std::mutex> lock(g_mutex);
  self_test(t);
  g_active.store(&t, std::memory_order_release);
}

void chain_keys(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n,
                std::uint8_t* out) noexcept {
  active().chain(parent, data, len, n, out);
}

void chain_keys2(const Chain chains[2], std::size_t len, std::size_t n) noexcept { active().chain2(chains, len, n); }

void chain_keys4(const Chain chains[4], std::size_t len, std::size_t n) noexcept { active().chain4(chains, len, n); }

}  // namespace sha256

namespace {

const std::uint32_t kInitialState[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

}  // namespace

// active() can only throw for a bad KVCORE_SHA256 or a failed self-test; both
// are surfaced earlier by the Python import, so terminating here is acceptable.
Sha256::Sha256() noexcept : fn_(sha256::active().fn) { reset(); }

void Sha256::reset() noexcept {
  std::memcpy(state_, kInitialState, sizeof state_);
  buf_len_ = 0;
  total_len_ = 0;
}

void Sha256::write(const std::uint8_t* data, std::size_t len) noexcept {
  if (len == 0) return;  // also makes write(nullptr, 0) safe for memcpy
  total_len_ += len;
  if (buf_len_ != 0) {
    const std::size_t take = len < 64 - buf_len_ ? len : 64 - buf_len_;
    std::memcpy(buf_ + buf_len_, data, take);
    buf_len_ += take;
    data += take;
    len -= take;
    if (buf_len_ < 64) return;
    fn_(state_, buf_, 1);
    buf_len_ = 0;
  }
  // Whole blocks go straight from the caller's memory in one transform call,
  // so SIMD transforms keep their state in registers across them.
  const std::size_t blocks = len / 64;
  if (blocks != 0) {
    fn_(state_, data, blocks);
    data += blocks * 64;
    len -= blocks * 64;
  }
  if (len != 0) {
    std::memcpy(buf_, data, len);
    buf_len_ = len;
  }
}

Digest Sha256::finish() noexcept {
  const std::uint64_t bits = total_len_ * 8;
  buf_[buf_len_++] = 0x80;
  if (buf_len_ > 56) {  // no room for the 8-byte length: pad out this block
    std::memset(buf_ + buf_len_, 0, 64 - buf_len_);
    fn_(state_, buf_, 1);
    buf_len_ = 0;
  }
  std::memset(buf_ + buf_len_, 0, 56 - buf_len_);
  for (int i = 0; i < 8; ++i) buf_[56 + i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
  fn_(state_, buf_, 1);
  buf_len_ = 0;

  // Whole-word stores (not byte stores) let the next key's 16-byte loads of this digest
  // be store-forwarded; byte-wise output cost a stall per chained block.
  std::uint32_t words[8];
  for (int i = 0; i < 8; ++i) words[i] = __builtin_bswap32(state_[i]);
  Digest out;
  std::memcpy(out.data(), words, sizeof words);
  return out;
}

Digest sha256_digest(const std::uint8_t* data, std::size_t len) noexcept {
  Sha256 h;
  h.write(data, len);
  return h.finish();
}

}  // namespace kvcore
