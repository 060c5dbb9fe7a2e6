// Merged linears (kernels/cpu/cpu_ops.h ConcatPackedRows): one call over the
// packed [a; b] gives every row the bits of the two separate calls — the
// experts' gate/up projections `w1‖w3` run that way (model/v41/kernels.h
// ExpertSwiGlu) — on every compiled target, with and without the BF16 pair
// dots, at 3 threads (row slices and tiles split), for the GEMV, the small-M
// micro-tiles and the block GEMM; and what cannot be merged is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "cpu_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_ops.h"

namespace deepinfer::cpu {
namespace {

// Activations: RandomActs (18 binades: the FP32 paths) or Gaussian (most
// FP4 groups take the AVX2 integer dots).
std::vector<float> Acts(int64_t n, uint64_t seed, bool gaussian) {
  if (!gaussian) return RandomActs(n, seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = nd(rng);
  return x;
}

// Row r of the merged output is [row r of a's call | row r of b's call].
void ExpectMergedRows(const std::vector<float>& merged, const std::vector<float>& ya, const std::vector<float>& yb,
                      int64_t M, int64_t Na, int64_t Nb, const char* what) {
  std::vector<float> want(static_cast<size_t>(M * (Na + Nb)));
  for (int64_t r = 0; r < M; ++r) {
    std::memcpy(want.data() + r * (Na + Nb), ya.data() + r * Na, static_cast<size_t>(Na) * 4);
    std::memcpy(want.data() + r * (Na + Nb) + Na, yb.data() + r * Nb, static_cast<size_t>(Nb) * 4);
  }
  EXPECT_TRUE(SameBits(merged, want)) << what << " M=" << M << " Na=" << Na << " Nb=" << Nb;
}

struct MergeShape {
  int64_t Na, Nb, K;
};
const MergeShape kMergeShapes[] = {{64, 64, 256}, {128, 40, 160}, {512, 512, 1024}, {64, 200, 96}};
const int64_t kRows[] = {1, 2, 3, 4, 5, 7, 16, 100};

// Every row count and both activation kinds, every target, pair dots on and
// off: the merged call's rows against the two separate calls (run(x, M, w, y)
// calls LinearFp8 or LinearFp4).
template <typename P, typename Run>
void CheckMerged(const P& a, const P& b, int64_t K, uint64_t* seed, const char* what, Run&& run) {
  const std::unique_ptr<P> ab = ConcatPackedRows(a, b);
  ASSERT_NE(ab, nullptr);
  const int64_t Na = a.src.out, Nb = b.src.out;
  EXPECT_EQ(ab->src.out, Na + Nb);
  EXPECT_EQ(ab->bytes(), a.bytes() + b.bytes());
  for (int64_t M : kRows)
    for (bool gaussian : {false, true}) {
      const std::vector<float> x = Acts(M * K, ++*seed, gaussian);
      WithAndWithoutBf16Dot([&] {
        ForEachTarget([&] {
          std::vector<float> ya(M * Na), yb(M * Nb), y(M * (Na + Nb), -1.0f);
          run(x, M, a, ya);
          run(x, M, b, yb);
          run(x, M, *ab, y);
          ExpectMergedRows(y, ya, yb, M, Na, Nb, what);
        });
      });
    }
}

TEST(MergedLinear, Fp8RowsAreTheSeparateCallsBits) {
  uint64_t seed = 7100;
  for (const MergeShape& sh : kMergeShapes) {
    const int64_t K = sh.K;
    const std::vector<uint8_t> wa = RandomE4M3(sh.Na * K, ++seed), wb = RandomE4M3(sh.Nb * K, ++seed);
    const std::vector<uint8_t> sa = RandomScales(((sh.Na + 31) / 32) * (K / 32), ++seed);
    const std::vector<uint8_t> sb = RandomScales(((sh.Nb + 31) / 32) * (K / 32), ++seed);
    const PackedFp8 a = PackFp8({wa.data(), sa.data(), sh.Na, K, 32});
    const PackedFp8 b = PackFp8({wb.data(), sb.data(), sh.Nb, K, 32});
    CheckMerged(a, b, K, &seed, "fp8",
                [](const std::vector<float>& x, int64_t M, const PackedFp8& w, std::vector<float>& y) {
                  LinearFp8(x.data(), M, w, 32, y.data());
                });
  }
}

TEST(MergedLinear, Fp4RowsAreTheSeparateCallsBits) {
  uint64_t seed = 7200;
  for (const MergeShape& sh : kMergeShapes) {
    const int64_t K = sh.K;
    std::mt19937_64 rng(++seed);
    std::vector<uint8_t> wa(sh.Na * K / 2), wb(sh.Nb * K / 2);
    for (auto& v : wa) v = static_cast<uint8_t>(rng());
    for (auto& v : wb) v = static_cast<uint8_t>(rng());
    const std::vector<uint8_t> sa = RandomScales(sh.Na * (K / 32), ++seed);
    const std::vector<uint8_t> sb = RandomScales(sh.Nb * (K / 32), ++seed);
    const PackedFp4 a = PackFp4({wa.data(), sa.data(), sh.Na, K});
    const PackedFp4 b = PackFp4({wb.data(), sb.data(), sh.Nb, K});
    CheckMerged(a, b, K, &seed, "fp4",
                [](const std::vector<float>& x, int64_t M, const PackedFp4& w, std::vector<float>& y) {
                  LinearFp4(x.data(), M, w, 32, y.data());
                });
    // And the separate calls are the reference's (so the merged one is too).
    const std::vector<float> x = Acts(3 * K, ++seed, true);
    std::vector<float> want(3 * sh.Na), got(3 * sh.Na);
    ref::LinearFp4(x.data(), 3, a.src, 32, want.data());
    LinearFp4(x.data(), 3, a, 32, got.data());
    EXPECT_TRUE(SameBits(got, want));
  }
}

TEST(MergedLinear, WhatCannotBeMergedIsRefused) {
  const int64_t K = 64;
  const std::vector<uint8_t> w = RandomE4M3(128 * K, 1), s = RandomScales(4 * 2, 2);
  const PackedFp8 a64 = PackFp8({w.data(), s.data(), 64, K, 32});
  const PackedFp8 a40 = PackFp8({w.data(), s.data(), 40, K, 32});  // not a whole tile
  const PackedFp8 k32 = PackFp8({w.data(), s.data(), 64, 32, 32});  // another width
  EXPECT_NE(ConcatPackedRows(a64, a40), nullptr);                     // b may be ragged
  EXPECT_EQ(ConcatPackedRows(a40, a64), nullptr);
  EXPECT_EQ(ConcatPackedRows(a64, k32), nullptr);
  std::vector<uint8_t> nan = w;
  nan[5] = 0x7F;  // an E4M3 NaN code: that weight takes the scalar path
  const PackedFp8 with_nan = PackFp8({nan.data(), s.data(), 64, K, 32});
  ASSERT_TRUE(with_nan.use_ref);
  EXPECT_EQ(ConcatPackedRows(a64, with_nan), nullptr);
  EXPECT_EQ(ConcatPackedRows(with_nan, a64), nullptr);
  std::vector<uint8_t> w4(64 * K / 2, 0x21), s4(64 * (K / 32), 127), s4bad = s4;
  s4bad[3] = 0xFF;  // a NaN scale byte: the scalar path
  const PackedFp4 f = PackFp4({w4.data(), s4.data(), 64, K});
  const PackedFp4 fbad = PackFp4({w4.data(), s4bad.data(), 64, K});
  EXPECT_NE(ConcatPackedRows(f, f), nullptr);
  EXPECT_EQ(ConcatPackedRows(f, fbad), nullptr);
  // A merged weight has no checkpoint view: an activation block that would
  // need the scalar path is an error naming it, not a null dereference.
  const std::unique_ptr<PackedFp8> m8 = ConcatPackedRows(a64, a64);
  const std::unique_ptr<PackedFp4> m4 = ConcatPackedRows(f, f);
  const std::vector<float> x = RandomActs(K, 3);
  std::vector<float> y(128);
  EXPECT_THROW(LinearFp8(x.data(), 1, *m8, 16, y.data()), Error);
  EXPECT_THROW(LinearFp4(x.data(), 1, *m4, 16, y.data()), Error);
  EXPECT_NO_THROW(LinearFp8(x.data(), 1, *m8, 32, y.data()));
  EXPECT_NO_THROW(LinearFp4(x.data(), 1, *m4, 64, y.data()));
}

}  // namespace
}  // namespace deepinfer::cpu
