// The block compression the SHA-NI and ARMv8 kernels share: 64 rounds as sixteen four-round
// steps with the message schedule expanded between them, for one stream or two in lock step.
// `Isa` gives the vector type and its operations (sha256_shani.cc, sha256_armv8.cc): its state
// as two vectors (ABEF/CDGH for SHA-NI, ABCD/EFGH for ARMv8), `four_rounds`, `schedule`,
// `load_be` and `add`. Each kernel's translation unit instantiates it with its own target flags.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore {
namespace sha256 {

template <typename Isa>
struct Rounds {
  using V = typename Isa::Vec;

  // One stream's state and message schedule, for the 2-way kernels.
  struct Lane {
    V s0, s1;
    V w0, w1, w2, w3;
  };

  // One block: 64 rounds on message words W0..W15 (lanes 0..3 of w0 = W0..W3, and so on) plus
  // the feed-forward addition. Fully unrolled so the schedule for the next quad overlaps the
  // latency-bound round chain of the current one.
  [[gnu::always_inline]] static void compress(V& s0, V& s1, V w0, V w1, V w2, V w3) {
    const V s0_in = s0, s1_in = s1;
    Isa::four_rounds(s0, s1, w0, 0);
    Isa::four_rounds(s0, s1, w1, 4);
    Isa::four_rounds(s0, s1, w2, 8);
    Isa::four_rounds(s0, s1, w3, 12);
    for (int t = 16; t < 64; t += 16) {
      w0 = Isa::schedule(w0, w1, w2, w3);
      Isa::four_rounds(s0, s1, w0, t);
      w1 = Isa::schedule(w1, w2, w3, w0);
      Isa::four_rounds(s0, s1, w1, t + 4);
      w2 = Isa::schedule(w2, w3, w0, w1);
      Isa::four_rounds(s0, s1, w2, t + 8);
      w3 = Isa::schedule(w3, w0, w1, w2);
      Isa::four_rounds(s0, s1, w3, t + 12);
    }
    s0 = Isa::add(s0, s0_in);
    s1 = Isa::add(s1, s1_in);
  }

  [[gnu::always_inline]] static void compress_blocks(V& s0, V& s1, const std::uint8_t* p, std::size_t blocks) {
    for (; blocks != 0; --blocks, p += 64)
      compress(s0, s1, Isa::load_be(p), Isa::load_be(p + 16), Isa::load_be(p + 32), Isa::load_be(p + 48));
  }

  // Rounds t..t+15 of both lanes, the two streams alternating quad by quad: each stream's round
  // chain is latency-bound, so the other's instructions issue in its gaps. kSchedule: expand W
  // first (t >= 16).
  template <bool kSchedule>
  [[gnu::always_inline]] static void sixteen_rounds2(Lane& a, Lane& b, int t) {
    if (kSchedule) {
      a.w0 = Isa::schedule(a.w0, a.w1, a.w2, a.w3);
      b.w0 = Isa::schedule(b.w0, b.w1, b.w2, b.w3);
    }
    Isa::four_rounds(a.s0, a.s1, a.w0, t);
    Isa::four_rounds(b.s0, b.s1, b.w0, t);
    if (kSchedule) {
      a.w1 = Isa::schedule(a.w1, a.w2, a.w3, a.w0);
      b.w1 = Isa::schedule(b.w1, b.w2, b.w3, b.w0);
    }
    Isa::four_rounds(a.s0, a.s1, a.w1, t + 4);
    Isa::four_rounds(b.s0, b.s1, b.w1, t + 4);
    if (kSchedule) {
      a.w2 = Isa::schedule(a.w2, a.w3, a.w0, a.w1);
      b.w2 = Isa::schedule(b.w2, b.w3, b.w0, b.w1);
    }
    Isa::four_rounds(a.s0, a.s1, a.w2, t + 8);
    Isa::four_rounds(b.s0, b.s1, b.w2, t + 8);
    if (kSchedule) {
      a.w3 = Isa::schedule(a.w3, a.w0, a.w1, a.w2);
      b.w3 = Isa::schedule(b.w3, b.w0, b.w1, b.w2);
    }
    Isa::four_rounds(a.s0, a.s1, a.w3, t + 12);
    Isa::four_rounds(b.s0, b.s1, b.w3, t + 12);
  }

  // One block of each lane (message words already in w0..w3) plus feed-forward.
  [[gnu::always_inline]] static void compress2(Lane& a, Lane& b) {
    const V a0 = a.s0, a1 = a.s1, b0 = b.s0, b1 = b.s1;
    sixteen_rounds2<false>(a, b, 0);
    sixteen_rounds2<true>(a, b, 16);
    sixteen_rounds2<true>(a, b, 32);
    sixteen_rounds2<true>(a, b, 48);
    a.s0 = Isa::add(a.s0, a0);
    a.s1 = Isa::add(a.s1, a1);
    b.s0 = Isa::add(b.s0, b0);
    b.s1 = Isa::add(b.s1, b1);
  }

  [[gnu::always_inline]] static void compress_blocks2(Lane& a, const std::uint8_t* pa, Lane& b, const std::uint8_t* pb,
                                                      std::size_t blocks) {
    for (; blocks != 0; --blocks, pa += 64, pb += 64) {
      a.w0 = Isa::load_be(pa);
      a.w1 = Isa::load_be(pa + 16);
      a.w2 = Isa::load_be(pa + 32);
      a.w3 = Isa::load_be(pa + 48);
      b.w0 = Isa::load_be(pb);
      b.w1 = Isa::load_be(pb + 16);
      b.w2 = Isa::load_be(pb + 32);
      b.w3 = Isa::load_be(pb + 48);
      compress2(a, b);
    }
  }
};

}  // namespace sha256
}  // namespace kvcore
