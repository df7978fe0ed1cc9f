// Known-answer and cross-check tests for kvcore SHA-256 transforms.
//
// Usage: sha256_kat [transform]
//   With an argument, or with KVCORE_SHA256 set, only that transform is
//   tested; otherwise every transform in available(). With KVCORE_SHA256 set,
//   also asserts the env-selected transform is the active one, so CI proves
//   which code path ran.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvcore/sha256.h"

namespace {

int g_passed = 0;
int g_failed = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "PASS" : "FAIL", what.c_str());
  (ok ? g_passed : g_failed)++;
}

std::string hex(const kvcore::Digest& d) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  for (std::uint8_t b : d) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

kvcore::Digest digest_of(const std::string& s) {
  return kvcore::sha256_digest(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
}

// Deterministic xorshift so failures reproduce.
struct Rng {
  std::uint64_t s = 0x9e3779b97f4a7c15ULL;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

std::vector<std::uint8_t> random_bytes(std::size_t n) {
  Rng rng;
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng.next() >> 56);
  return v;
}

constexpr std::size_t kMaxLen = 300;

// Reference digests from the portable transform, for every prefix length.
std::vector<kvcore::Digest> portable_prefix_digests(const std::vector<std::uint8_t>& msg) {
  kvcore::sha256::select("portable");
  std::vector<kvcore::Digest> out;
  for (std::size_t len = 0; len <= kMaxLen; ++len) out.push_back(kvcore::sha256_digest(msg.data(), len));
  return out;
}

// Fused chain (Transform::chain) vs the streaming Sha256 class on the portable
// transform, one key at a time: key[i] = SHA-256(key[i-1] || message i).
void test_chain(const std::string& name) {
  const std::string p = "[" + name + "] ";
  // Around every padding boundary: 32 + len hitting 55/56 bytes mod 64
  // (length spills into an extra block), multiples of 64, and len < 32 (the
  // whole message inside block 0).
  static const std::size_t kLens[] = {1,  4,  20, 23,  24,  31,  32,  55,  56,  63,  64,   87,
                                      88, 95, 96, 119, 120, 127, 128, 129, 200, 256, 1000, 4096};
  static const std::size_t kCounts[] = {1, 2, 7};
  const std::vector<std::uint8_t> pool = random_bytes(7 * 4096 + 32);
  const std::uint8_t* parent = pool.data() + 7 * 4096;

  struct Case {
    std::size_t len, n;
    std::vector<std::uint8_t> data;  // data() + 1 is the (odd) message start
    std::vector<kvcore::Digest> want;
  };
  std::vector<Case> cases;
  kvcore::sha256::select("portable");
  for (std::size_t len : kLens) {
    for (std::size_t n : kCounts) {
      // Sized exactly, so a sanitizer build catches reads past the last message.
      Case c{len, n, std::vector<std::uint8_t>(1 + n * len), {}};
      std::memcpy(c.data.data() + 1, pool.data(), n * len);
      kvcore::Digest prev;
      std::memcpy(prev.data(), parent, 32);
      for (std::size_t i = 0; i < n; ++i) {
        kvcore::Sha256 h;
        h.write(prev.data(), 32);
        h.write(c.data.data() + 1 + i * len, len);
        prev = h.finish();
        c.want.push_back(prev);
      }
      cases.push_back(std::move(c));
    }
  }

  kvcore::sha256::select(name);
  const kvcore::sha256::ChainFn chain = kvcore::sha256::active().chain;
  constexpr std::uint8_t kSentinel = 0xcd;
  std::size_t bad = 0;
  std::string first_bad;
  for (const Case& c : cases) {
    std::vector<std::uint8_t> out(32 * c.n + 32, kSentinel);  // one spare key: detects overruns
    chain(parent, c.data.data() + 1, c.len, c.n, out.data());
    bool ok = true;
    for (std::size_t i = 0; i < c.n; ++i) ok = ok && std::memcmp(out.data() + 32 * i, c.want[i].data(), 32) == 0;
    for (std::size_t i = 32 * c.n; i < out.size(); ++i) ok = ok && out[i] == kSentinel;
    if (!ok && bad++ == 0) first_bad = " (first: len " + std::to_string(c.len) + " n " + std::to_string(c.n) + ")";
  }
  check(bad == 0, p + "chain == streaming Sha256 for " + std::to_string(cases.size()) +
                      " (len, n) cases, unaligned data" + (bad ? ", " + std::to_string(bad) + " bad" + first_bad : ""));

  // n == 0 must not touch out.
  std::vector<std::uint8_t> out(64, kSentinel);
  chain(parent, cases[0].data.data() + 1, 1, 0, out.data());
  bool untouched = true;
  for (std::uint8_t b : out) untouched = untouched && b == kSentinel;
  check(untouched, p + "chain with n = 0 writes nothing");

  // The public entry point dispatches to the active transform's chain.
  const Case& c = cases.back();
  std::vector<std::uint8_t> via_api(32 * c.n);
  kvcore::sha256::chain_keys(parent, c.data.data() + 1, c.len, c.n, via_api.data());
  check(std::memcmp(via_api.data() + 32 * (c.n - 1), c.want.back().data(), 32) == 0, p + "chain_keys() matches");
}

// `msg` padded as FIPS 180-4 section 5.1.1 pads it: whole 64-byte blocks.
std::vector<std::uint8_t> pad(const std::string& msg) {
  std::vector<std::uint8_t> out(msg.begin(), msg.end());
  out.push_back(0x80);
  while (out.size() % 64 != 56) out.push_back(0);
  const std::uint64_t bits = static_cast<std::uint64_t>(msg.size()) * 8;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(bits >> (56 - 8 * i)));
  return out;
}

std::string hex_state(const std::uint32_t st[8]) {
  kvcore::Digest d;
  for (int w = 0; w < 8; ++w)
    for (int b = 0; b < 4; ++b) d[4 * w + b] = static_cast<std::uint8_t>(st[w] >> (24 - 8 * b));
  return hex(d);
}

// The interleaved kernels (Transform::fn2 / fn4 / chain2 / chain4): FIPS vectors through every
// stream, and random differential checks against the same transform's single-stream kernels
// (themselves checked against portable above).
void test_interleaved(const std::string& name, std::size_t lanes) {
  const std::string p = "[" + name + "] " + std::to_string(lanes) + "-way ";
  kvcore::sha256::select(name);
  const kvcore::sha256::Transform& t = kvcore::sha256::active();
  const kvcore::sha256::TransformNFn fn = lanes == 2 ? t.fn2 : t.fn4;
  const kvcore::sha256::ChainNFn chain = lanes == 2 ? t.chain2 : t.chain4;
  static const std::uint32_t kIv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

  // FIPS 180-4 examples grouped by padded block count: "abc" and "" (1 block each), the 448-bit
  // message and the 896-bit one (2 blocks each); every stream gets one of the pair, by parity
  // of its index, then the other (no stream may depend on its position).
  struct Pair {
    std::string a, b;
    const char *want_a, *want_b;
  };
  const Pair pairs[] = {
      {"abc", "", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrs"
       "tnopqrstu",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  for (const Pair& pr : pairs) {
    const std::vector<std::uint8_t> a = pad(pr.a), b = pad(pr.b);
    for (std::size_t swap = 0; swap < 2; ++swap) {
      std::uint32_t st[4][8];
      kvcore::sha256::Stream streams[4];
      for (std::size_t i = 0; i < lanes; ++i) {
        std::memcpy(st[i], kIv, sizeof st[i]);
        streams[i] = {st[i], ((i + swap) % 2 == 0 ? a : b).data()};
      }
      fn(streams, a.size() / 64);
      bool ok = true;
      for (std::size_t i = 0; i < lanes; ++i)
        ok = ok && hex_state(st[i]) == ((i + swap) % 2 == 0 ? pr.want_a : pr.want_b);
      check(ok, p + "NIST vectors (" + std::to_string(a.size() / 64) + " blocks each)" + (swap ? ", swapped" : ""));
    }
  }

  // Random states and unaligned random blocks, 0..9 blocks, vs the single-stream fn.
  Rng rng;
  const std::vector<std::uint8_t> pool = random_bytes(4 * 9 * 64 + 3);
  std::size_t bad = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t blocks = rng.next() % 10;
    std::uint32_t st[4][8], ref[4][8];
    kvcore::sha256::Stream streams[4];
    for (std::size_t i = 0; i < lanes; ++i) {
      for (int w = 0; w < 8; ++w) st[i][w] = ref[i][w] = static_cast<std::uint32_t>(rng.next());
      streams[i] = {st[i], pool.data() + i * 9 * 64 + rng.next() % 3};
    }
    fn(streams, blocks);
    for (std::size_t i = 0; i < lanes; ++i) {
      t.fn(ref[i], streams[i].data, blocks);
      if (std::memcmp(st[i], ref[i], sizeof st[i]) != 0) ++bad;
    }
  }
  check(bad == 0, p + "transform == single-stream on 200 random (states, blocks) groups" +
                      (bad ? " (" + std::to_string(bad) + " bad)" : ""));

  // Chains: every padding case of test_chain's lengths, different chains of n keys each,
  // unaligned and sized exactly, vs chain() per chain; a spare key after each output checks for
  // overruns. Parents alias nothing, then alias their own out (as block_keys_many uses them).
  static const std::size_t kLens[] = {1,  4,  20, 23,  24,  31,  32,  55,  56,  63,  64,   87,
                                      88, 95, 96, 119, 120, 127, 128, 129, 200, 256, 1000, 4096};
  constexpr std::uint8_t kSentinel = 0xcd;
  const std::vector<std::uint8_t> src = random_bytes(4 * 7 * 4096 + 4 * 32);
  bad = 0;
  std::string first_bad;
  std::size_t cases = 0;
  for (std::size_t len : kLens) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}}) {
      ++cases;
      std::vector<std::uint8_t> data[4], want[4], got[4], aliased[4];
      kvcore::sha256::Chain plain[4], alias[4];
      for (std::size_t i = 0; i < lanes; ++i) {
        data[i].assign(1 + n * len, 0);
        std::memcpy(data[i].data() + 1, src.data() + i * 7 * 4096, n * len);
        const std::uint8_t* parent = src.data() + 4 * 7 * 4096 + 32 * i;
        want[i].assign(32 * n + 32, kSentinel);
        t.chain(parent, data[i].data() + 1, len, n, want[i].data());
        got[i].assign(32 * n + 32, kSentinel);
        plain[i] = {parent, data[i].data() + 1, got[i].data()};
        // Aliased: each parent stored just before its own output.
        aliased[i].assign(32 * n + 64, kSentinel);
        std::memcpy(aliased[i].data(), parent, 32);
        alias[i] = {aliased[i].data(), data[i].data() + 1, aliased[i].data() + 32};
      }
      chain(plain, len, n);
      chain(alias, len, n);
      bool ok = true;
      for (std::size_t i = 0; i < lanes; ++i)
        ok = ok && got[i] == want[i] && std::memcmp(aliased[i].data() + 32, want[i].data(), want[i].size()) == 0;
      if (!ok && bad++ == 0) first_bad = " (first: len " + std::to_string(len) + " n " + std::to_string(n) + ")";
    }
  }
  check(bad == 0, p + "chain == chain() per stream for " + std::to_string(cases) + " (len, n) cases" +
                      (bad ? ", " + std::to_string(bad) + " bad" + first_bad : ""));

  // The public entry points dispatch to the active transform's kernels.
  std::vector<std::uint8_t> d(4 * 3 * 64);
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::uint8_t>(i * 7);
  std::uint8_t parent[32] = {1, 2, 3};
  std::uint8_t got[4][3 * 32], want[4][3 * 32];
  kvcore::sha256::Chain chains[4];
  for (std::size_t i = 0; i < lanes; ++i) {
    chains[i] = {parent, d.data() + i * 3 * 64, got[i]};
    t.chain(parent, d.data() + i * 3 * 64, 64, 3, want[i]);
  }
  (lanes == 2 ? kvcore::sha256::chain_keys2 : kvcore::sha256::chain_keys4)(chains, 64, 3);
  check(std::memcmp(got, want, lanes * sizeof got[0]) == 0, p + "chain_keys" + std::to_string(lanes) + "() matches");
}

void test_transform(const std::string& name, const std::vector<std::uint8_t>& msg,
                    const std::vector<kvcore::Digest>& ref) {
  kvcore::sha256::select(name);
  check(kvcore::sha256::active().name == name, "[" + name + "] select() makes it active");
  const std::string p = "[" + name + "] ";

  struct Kat {
    const char* label;
    std::string msg;
    const char* want;
  };
  const Kat kats[] = {
      {"empty", "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      // FIPS 180-4 / NIST 448-bit message (14 overlapping 4-letter groups).
      {"448-bit", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"896-bit",
       "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrs"
       "tnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
      {"one million 'a'", std::string(1000000, 'a'),
       "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
      {"block-key byte 0x00", std::string(1, '\0'), "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"},
  };
  for (const Kat& k : kats) {
    const std::string got = hex(digest_of(k.msg));
    check(got == k.want, p + "NIST " + k.label + (got == k.want ? "" : " got " + got));
  }

  // Every length 0..300 crosses all padding cases (length fits / spills).
  std::size_t bad = 0, first_bad = 0;
  for (std::size_t len = 0; len <= kMaxLen; ++len) {
    if (kvcore::sha256_digest(msg.data(), len) != ref[len] && bad++ == 0) first_bad = len;
  }
  check(bad == 0, p + "lengths 0..300 match portable" +
                      (bad ? " (" + std::to_string(bad) + " bad, first " + std::to_string(first_bad) + ")" : ""));

  // Random-size write() pieces vs one write, for several seeds.
  Rng rng;
  bad = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t len = rng.next() % (kMaxLen + 1);
    kvcore::Sha256 h;
    std::size_t off = 0;
    while (off < len) {
      std::size_t piece = rng.next() % 130;  // 0 included: empty writes must be harmless
      if (piece > len - off) piece = len - off;
      h.write(msg.data() + off, piece);
      off += piece;
    }
    if (h.finish() != ref[len]) ++bad;
  }
  check(bad == 0, p + "random-size write() pieces match one write");

  // reset() makes the object reusable.
  {
    kvcore::Sha256 h;
    h.write(msg.data(), 100);
    (void)h.finish();
    h.reset();
    h.write(msg.data(), 200);
    check(h.finish() == ref[200], p + "reset() then reuse");
  }

  // Multi-block calls vs one block at a time (state must carry across blocks
  // inside one call), also cross-checked against the portable transform.
  {
    const auto fn = kvcore::sha256::active().fn;
    const std::size_t blocks = 37;
    std::vector<std::uint8_t> data = random_bytes(blocks * 64);
    const std::uint32_t init[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::uint32_t multi[8], single[8], portable[8];
    std::memcpy(multi, init, sizeof multi);
    std::memcpy(single, init, sizeof single);
    std::memcpy(portable, init, sizeof portable);
    fn(multi, data.data(), blocks);
    for (std::size_t i = 0; i < blocks; ++i) fn(single, data.data() + 64 * i, 1);
    kvcore::sha256::select("portable");
    kvcore::sha256::active().fn(portable, data.data(), blocks);
    kvcore::sha256::select(name);
    check(std::memcmp(multi, single, sizeof multi) == 0, p + "multi-block call == block-at-a-time");
    check(std::memcmp(multi, portable, sizeof multi) == 0, p + "multi-block call == portable");
    // Unaligned input pointer.
    std::vector<std::uint8_t> shifted(blocks * 64 + 1);
    std::memcpy(shifted.data() + 1, data.data(), blocks * 64);
    std::uint32_t unaligned[8];
    std::memcpy(unaligned, init, sizeof unaligned);
    fn(unaligned, shifted.data() + 1, blocks);
    check(std::memcmp(multi, unaligned, sizeof multi) == 0, p + "unaligned input");
  }

  test_chain(name);
  test_interleaved(name, 2);
  test_interleaved(name, 4);
}

int run(int argc, char** argv) {
  std::string avail;
  for (const auto& n : kvcore::sha256::available()) avail += (avail.empty() ? "" : ", ") + n;
  std::printf("available transforms: %s\n", avail.c_str());

  const char* env = std::getenv("KVCORE_SHA256");
  const bool have_env = env != nullptr && *env != '\0';
  std::vector<std::string> names;
  if (have_env) {
    // Must be checked before any select(): this is the env-driven selection.
    const std::string got = kvcore::sha256::active().name;
    check(got == env, std::string("active() honours KVCORE_SHA256=") + env + " (active: " + got + ")");
  }
  if (argc > 1)
    names.push_back(argv[1]);
  else if (have_env)
    names.push_back(env);
  else
    names = kvcore::sha256::available();

  const std::vector<std::uint8_t> msg = random_bytes(kMaxLen);
  const std::vector<kvcore::Digest> ref = portable_prefix_digests(msg);
  for (const auto& n : names) test_transform(n, msg, ref);

  // Unknown names must be rejected with invalid_argument.
  bool threw = false;
  try {
    kvcore::sha256::select("no-such-transform");
  } catch (const std::invalid_argument& e) {
    threw = true;
    std::printf("  (select(\"no-such-transform\") -> %s)\n", e.what());
  }
  check(threw, "select() rejects unknown name");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    run(argc, argv);
  } catch (const std::exception& e) {
    std::printf("FAIL: uncaught exception: %s\n", e.what());
    ++g_failed;
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
