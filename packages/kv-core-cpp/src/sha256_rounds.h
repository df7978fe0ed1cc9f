// The block compression and fused key chain the SHA-NI and ARMv8 kernels share, for N streams
// in lock step (N = 1, 2 or 4): 64 rounds as sixteen four-round steps with the message schedule
// expanded between them. `Isa` gives the vector type and its operations (sha256_shani.cc,
// sha256_armv8.cc): the state as two vectors (ABEF/CDGH for SHA-NI, ABCD/EFGH for ARMv8),
// `four_rounds`, `schedule`, `load_be`, `store_be`, `add`, `initial`, `load_state`,
// `store_state` and `digest_words`. Each kernel's translation unit instantiates it with its own
// target flags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kvcore/sha256.h"
#include "sha256_transforms.h"

namespace kvcore {
namespace sha256 {

template <typename Isa>
struct Rounds {
  using V = typename Isa::Vec;

  // One stream's state and message schedule (w[0] holds W0..W3, and so on).
  struct Lane {
    V s0, s1;
    V w[4];
  };

  // f(i) for lane i = 0..N-1, unrolled at compile time so every lane stays in registers.
  template <std::size_t N, typename F>
  [[gnu::always_inline]] static void each(F&& f) {
    each_of(f, std::make_index_sequence<N>{});
  }
  template <typename F, std::size_t... I>
  [[gnu::always_inline]] static void each_of(F& f, std::index_sequence<I...>) {
    (f(std::integral_constant<std::size_t, I>{}), ...);
  }

  // Rounds t+4Q..t+4Q+3 of every lane, the lanes one after the other: each stream's round
  // chain is latency-bound, so the others' instructions issue in its gaps. kSchedule: expand
  // the quad's message words first (t >= 16).
  template <int Q, bool kSchedule, std::size_t... I>
  [[gnu::always_inline]] static void quad(Lane* l, int t, std::index_sequence<I...>) {
    if (kSchedule)
      ((l[I].w[Q] = Isa::schedule(l[I].w[Q], l[I].w[(Q + 1) & 3], l[I].w[(Q + 2) & 3], l[I].w[(Q + 3) & 3])), ...);
    (Isa::four_rounds(l[I].s0, l[I].s1, l[I].w[Q], t + 4 * Q), ...);
  }

  template <std::size_t N, bool kSchedule>
  [[gnu::always_inline]] static void sixteen_rounds(Lane* l, int t) {
    quad<0, kSchedule>(l, t, std::make_index_sequence<N>{});
    quad<1, kSchedule>(l, t, std::make_index_sequence<N>{});
    quad<2, kSchedule>(l, t, std::make_index_sequence<N>{});
    quad<3, kSchedule>(l, t, std::make_index_sequence<N>{});
  }

  // One block of each lane (message words already in w) plus the feed-forward addition.
  template <std::size_t N>
  [[gnu::always_inline]] static void compress(Lane* l) {
    V in0[N], in1[N];
    each<N>([&](auto i) {
      in0[i] = l[i].s0;
      in1[i] = l[i].s1;
    });
    sixteen_rounds<N, false>(l, 0);
    sixteen_rounds<N, true>(l, 16);
    sixteen_rounds<N, true>(l, 32);
    sixteen_rounds<N, true>(l, 48);
    each<N>([&](auto i) {
      l[i].s0 = Isa::add(l[i].s0, in0[i]);
      l[i].s1 = Isa::add(l[i].s1, in1[i]);
    });
  }

  // `blocks` consecutive blocks of each lane, lane i's from p[i].
  template <std::size_t N>
  [[gnu::always_inline]] static void compress_blocks(Lane* l, const std::uint8_t* const* p, std::size_t blocks) {
    for (std::size_t b = 0; b < blocks; ++b) {
      each<N>([&](auto i) {
        for (int k = 0; k < 4; ++k) l[i].w[k] = Isa::load_be(p[i] + 64 * b + 16 * k);
      });
      compress<N>(l);
    }
  }

  // TransformFn (N = 1) and the interleaved TransformNFn.
  template <std::size_t N>
  [[gnu::always_inline]] static void transform(const Stream* streams, std::size_t blocks) {
    Lane l[N];
    const std::uint8_t* p[N];
    each<N>([&](auto i) {
      Isa::load_state(streams[i].state, l[i].s0, l[i].s1);
      p[i] = streams[i].data;
    });
    compress_blocks<N>(l, p, blocks);
    each<N>([&](auto i) { Isa::store_state(streams[i].state, l[i].s0, l[i].s1); });
  }

  // ChainFn (N = 1) and the interleaved ChainNFn: every chain has the same len, so one plan
  // shape serves all; each has its own copy of the tail buffer (different data bytes). Message
  // words 0..7 of each key are the previous key's digest words, carried in registers.
  template <std::size_t N>
  [[gnu::always_inline]] static void chain(const Chain* chains, std::size_t len, std::size_t n) {
    detail::ChainPlan plan;
    detail::chain_plan_init(plan, len);
    alignas(16) std::uint8_t buf[N][sizeof plan.buf];
    const std::uint8_t* data[N];
    std::uint8_t* out[N];
    V prev0[N], prev1[N];
    each<N>([&](auto i) {
      std::memcpy(buf[i], plan.buf, sizeof plan.buf);
      data[i] = chains[i].data;
      out[i] = chains[i].out;
      prev0[i] = Isa::load_be(chains[i].parent);  // read before any key is written: may alias out
      prev1[i] = Isa::load_be(chains[i].parent + 16);
    });
    for (std::size_t k = 0; k < n; ++k) {
      Lane l[N];
      const std::uint8_t* p[N];
      each<N>([&](auto i) {
        detail::copy_short(buf[i], data[i] + plan.copy_off, plan.copy_len);
        const std::uint8_t* hi = plan.hi_from_buf ? buf[i] : data[i];
        Isa::initial(l[i].s0, l[i].s1);
        l[i].w[0] = prev0[i];
        l[i].w[1] = prev1[i];
        l[i].w[2] = Isa::load_be(hi);
        l[i].w[3] = Isa::load_be(hi + 16);
      });
      compress<N>(l);
      if (plan.mid_blocks != 0) {
        each<N>([&](auto i) { p[i] = data[i] + 32; });  // data + 32 may be past the end
        compress_blocks<N>(l, p, plan.mid_blocks);
      }
      each<N>([&](auto i) { p[i] = buf[i] + plan.tail_off; });
      compress_blocks<N>(l, p, plan.tail_blocks);
      each<N>([&](auto i) {
        Isa::digest_words(l[i].s0, l[i].s1, prev0[i], prev1[i]);
        Isa::store_be(out[i], prev0[i]);
        Isa::store_be(out[i] + 16, prev1[i]);
        data[i] += len;
        out[i] += 32;
      });
    }
  }
};

}  // namespace sha256
}  // namespace kvcore

// The entry points sha256_transforms.h declares for one ISA (`name`: shani, armv8), all from its
// Rounds<Isa> `R`: one stream, 2 and 4 interleaved.
#define KVCORE_SHA256_KERNELS(name, R)                                                                       \
  void transform_##name(std::uint32_t state[8], const std::uint8_t* data, std::size_t blocks) {              \
    const Stream s{state, data};                                                                             \
    R::transform<1>(&s, blocks);                                                                             \
  }                                                                                                          \
  void chain_##name(const std::uint8_t parent[32], const std::uint8_t* data, std::size_t len, std::size_t n, \
                    std::uint8_t* out) {                                                                     \
    const Chain c{parent, data, out};                                                                        \
    R::chain<1>(&c, len, n);                                                                                 \
  }                                                                                                          \
  void transform2_##name(const Stream streams[2], std::size_t blocks) { R::transform<2>(streams, blocks); }  \
  void transform4_##name(const Stream streams[4], std::size_t blocks) { R::transform<4>(streams, blocks); }  \
  void chain2_##name(const Chain chains[2], std::size_t len, std::size_t n) { R::chain<2>(chains, len, n); } \
  void chain4_##name(const Chain chains[4], std::size_t len, std::size_t n) { R::chain<4>(chains, len, n); }
