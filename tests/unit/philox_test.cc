// Tests for sampling/philox.h: the published Random123 known-answer vectors
// (kat_vectors: counter words, key words → output words), and the sampler's
// keying convention.
#include "sampling/philox.h"

#include <set>

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

struct Kat {
  PhiloxCounter ctr;
  PhiloxKey key;
  PhiloxCounter expected;
};

// Random123 kat_vectors, "philox4x32 10" lines.
const Kat kKat10[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

// Random123 kat_vectors, "philox4x32 7" lines (same code path, 7 rounds).
const Kat kKat7[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
};

TEST(Philox, Random123KnownAnswers10Rounds) {
  for (const Kat& k : kKat10) EXPECT_EQ(Philox4x32<10>(k.ctr, k.key), k.expected);
}

TEST(Philox, Random123KnownAnswers7Rounds) {
  for (const Kat& k : kKat7) EXPECT_EQ(Philox4x32<7>(k.ctr, k.key), k.expected);
}

TEST(Philox, IsConstexpr) {
  constexpr PhiloxCounter r = Philox4x32<10>({0, 0, 0, 0}, {0, 0});
  static_assert(r[0] == 0x6627e8d5u && r[3] == 0x9b00dbd8u);
  SUCCEED();
}

TEST(Philox, SamplerKeyingUsesSeedAndCounterWords) {
  // seed → key (lo, hi); position → counter words 0/1, draw → 2, stream → 3.
  const int64_t seed = static_cast<int64_t>(0x299f31d0a4093822ull);
  EXPECT_EQ(PhiloxKeyForSeed(seed), (PhiloxKey{0xa4093822u, 0x299f31d0u}));
  EXPECT_EQ(PhiloxCounterFor(0x85a308d3243f6a88ull, 0x13198a2e, 0x03707344),
            (PhiloxCounter{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}));
  // So this uniform is built from the third KAT vector: word1 << 32 | word0.
  EXPECT_EQ(PhiloxUniform64(seed, 0x85a308d3243f6a88ull, 0x13198a2e, 0x03707344),
            0x94fdccebd16cfe09ull);
  // Negative seeds use their two's-complement bits.
  EXPECT_EQ(PhiloxKeyForSeed(-1), (PhiloxKey{0xffffffffu, 0xffffffffu}));
  EXPECT_EQ(PhiloxUniform64(-1, ~uint64_t{0}, 0xffffffffu, 0xffffffffu), 0x41c83b0e408f276dull);
}

TEST(Philox, DistinctCountersGiveDistinctDraws) {
  // Positions, draw indices, streams and seeds each change the output.
  std::set<uint64_t> seen;
  for (uint64_t pos = 0; pos < 64; ++pos)
    for (uint32_t draw = 0; draw < 4; ++draw)
      for (uint32_t stream = 0; stream < 2; ++stream)
        for (int64_t seed : {0LL, 1LL, (1LL << 32)}) seen.insert(PhiloxUniform64(seed, pos, draw, stream));
  EXPECT_EQ(seen.size(), 64u * 4u * 2u * 3u);
}

TEST(Philox, BitsAreBalanced) {
  // Each of the 64 output bits is set about half the time over 20000 positions
  // (binomial sd = 70.7; 6 sd = 424).
  const int n = 20000;
  int count[64] = {};
  for (int i = 0; i < n; ++i) {
    const uint64_t u = PhiloxUniform64(12345, static_cast<uint64_t>(i));
    for (int b = 0; b < 64; ++b) count[b] += (u >> b) & 1;
  }
  for (int b = 0; b < 64; ++b) EXPECT_NEAR(count[b], n / 2, 424) << "bit " << b;
}

}  // namespace
}  // namespace deepinfer
