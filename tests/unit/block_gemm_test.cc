// The prefill block GEMM of the FP8/FP4 linears (kernels/cpu/hwy_util-inl.h
// RunBlockItems: weights converted once per (tile, K block), activations
// packed in groups of the micro-tile height) against the scalar reference,
// bit for bit, on every compiled target, at the shapes where the packing and
// the micro-tile tails meet: M not a multiple of the group height, M one
// past an m-chunk (96), N not a multiple of 64 (and below one micro
// column), K of a single block, 128-wide activation blocks (klen 128), and
// 1 and 2 threads. The prescaled operands (linear_common.h
// BlockPrescaleExact: the folds as one add) are checked at the edges of
// their guard, on both sides.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/linear_common.h"
#include "kernels/ref/ref_ops.h"

namespace deepinfer::cpu {
namespace {

std::vector<float> Acts(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> e(-12.0f, 6.0f), u(1.0f, 2.0f);
  std::vector<float> x(n);
  for (auto& v : x) {
    const uint64_t r = rng();
    v = RoundBf16(std::ldexp(u(rng), static_cast<int>(e(rng))) * ((r & 1) ? -1.0f : 1.0f));
  }
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
  int64_t M, N, K;
  int ab;
};
const std::vector<Shape> kShapes = {{16, 64, 32, 32},  {17, 40, 32, 32},   {23, 8, 64, 32},   {97, 130, 96, 32},
                                    {101, 64, 64, 32}, {200, 72, 160, 32}, {20, 130, 256, 128}, {50, 24, 384, 128},
                                    // m-chunks above 96 rows (MChunkRows: 5 tiles; one thread 384 + 116, two
                                    // threads 288 + 212), each ending in a partial group.
                                    {500, 260, 64, 32}};

template <typename F>
void ForEachTargetAndThreads(F&& body) {
  SetMinParallelMacs(0);
  for (int64_t t : AvailableTargets()) {
    ForceTarget(t);
    for (int th : {1, 2}) {
      SetNumThreads(th);
      SCOPED_TRACE("target " + TargetName(t) + " threads " + std::to_string(th));
      body();
    }
  }
  ForceTarget(0);
  SetMinParallelMacs(int64_t{1} << 20);
}

TEST(BlockGemm, Fp8BitIdentical) {
  ForEachTargetAndThreads([] {
    uint64_t seed = 1;
    for (const Shape& s : kShapes) {
      std::mt19937_64 rng(++seed);
      std::vector<uint8_t> w(s.N * s.K), sc(((s.N + s.ab - 1) / s.ab) * (s.K / s.ab));  // weight block = act block
      for (auto& c : w) do c = static_cast<uint8_t>(rng()); while (E4M3IsNaN(c));
      for (auto& b : sc) b = static_cast<uint8_t>(110 + rng() % 26);
      const std::vector<float> x = Acts(s.M * s.K, seed + 100);
      const ref::Fp8Weight view{w.data(), sc.data(), s.N, s.K, s.ab};
      std::vector<float> want(s.M * s.N), got(s.M * s.N, -1.0f);
      ref::LinearFp8(x.data(), s.M, view, s.ab, want.data());
      const PackedFp8 p = PackFp8(view);
      LinearFp8(x.data(), s.M, p, s.ab, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ab=" << s.ab;
    }
  });
}

TEST(BlockGemm, Fp4BitIdentical) {
  ForEachTargetAndThreads([] {
    uint64_t seed = 50;
    for (const Shape& s : kShapes) {
      std::mt19937_64 rng(++seed);
      std::vector<uint8_t> w(s.N * s.K / 2), sc(s.N * (s.K / 32));
      for (auto& b : w) b = static_cast<uint8_t>(rng());
      for (auto& b : sc) b = static_cast<uint8_t>(110 + rng() % 26);
      const std::vector<float> x = Acts(s.M * s.K, seed + 100);
      const ref::Fp4Weight view{w.data(), sc.data(), s.N, s.K};
      std::vector<float> want(s.M * s.N), got(s.M * s.N, -1.0f);
      ref::LinearFp4(x.data(), s.M, view, s.ab, want.data());
      const PackedFp4 p = PackFp4(view);
      LinearFp4(x.data(), s.M, p, s.ab, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ab=" << s.ab;
    }
  });
}

// K = 0: every output is the empty sum, 0, on the block path too (no K
// block runs, so the rows are stored from the zeroed accumulators).
TEST(BlockGemm, EmptyInnerDimensionGivesZeros) {
  ForEachTargetAndThreads([] {
    const int64_t M = 300, N = 64;
    const PackedBf16 p = PackBf16({nullptr, N, 0});
    std::vector<float> y(M * N, 123.0f);
    LinearBf16(nullptr, M, p, y.data());
    EXPECT_EQ(std::count(y.begin(), y.end(), 0.0f), M * N);
  });
}

// The block step's fold acc = acc + (partial·s_act)·s_w starts from acc = +0
// (the reference's sum), so a block whose term underflows to −0 must leave
// +0, not −0 (a first block, and two such blocks). Per 32-column block of a
// row: 1e-4 (its amax: s_act 2^-22) against a zero weight, then −2^-30
// (q = −2^-8) against the smallest weight (E4M3 2^-9, E2M1 0.5) with
// s_w = 2^-127: the term is below 2^-150 in magnitude, i.e. −0. The scale
// range fails the prescale guard, so the block path takes the scaled folds.
TEST(BlockGemm, ScaledFoldOfAnUnderflowToMinusZeroGivesPlusZero) {
  ForEachTargetAndThreads([] {
    for (const int64_t K : {32, 64}) {
      const int64_t M = 18, N = 72;
      std::vector<float> x(M * K, 0.0f);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t b = 0; b < K / 32; ++b) {
          const int64_t k = b * 32 + 2 * ((m + b) % 16);
          x[m * K + k] = 1e-4f;
          x[m * K + k + 1] = -std::ldexp(1.0f, -30);
        }
      std::vector<float> want(M * N), got(M * N, -1.0f);
      {
        std::vector<uint8_t> w(N * K, 0), sc(((N + 31) / 32) * (K / 32), 0);
        for (int64_t i = 1; i < N * K; i += 2) w[i] = 0x01;  // odd columns: E4M3 2^-9
        const ref::Fp8Weight view{w.data(), sc.data(), N, K, 32};
        const PackedFp8 p = PackFp8(view);
        ref::LinearFp8(x.data(), M, view, 32, want.data());
        LinearFp8(x.data(), M, p, 32, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "fp8 K=" << K;
        for (float v : want) ASSERT_TRUE(v == 0.0f && !std::signbit(v)) << v;
      }
      {
        std::vector<uint8_t> w(N * K / 2, 0x10), sc(N * (K / 32), 0);  // odd columns: E2M1 code 1 = 0.5
        const ref::Fp4Weight view{w.data(), sc.data(), N, K};
        const PackedFp4 p = PackFp4(view);
        std::fill(got.begin(), got.end(), -1.0f);
        ref::LinearFp4(x.data(), M, view, 32, want.data());
        LinearFp4(x.data(), M, p, 32, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "fp4 K=" << K;
        for (float v : want) ASSERT_TRUE(v == 0.0f && !std::signbit(v)) << v;
      }
    }
  });
}

// The m-chunk of the prefill items (linear_common.h MChunkRows): 96 rows,
// or up to max_mchunk where the call still has 4 items per thread, always
// a multiple of 96 (the packed activation groups never straddle a chunk).
TEST(BlockGemm, MChunkRows) {
  QArgs a;
  a.tiles = 36;
  a.M = 1024;
  EXPECT_EQ(MChunkRows(a, 2), 96);  // no max_mchunk: the fixed chunk
  a.max_mchunk = 384;
  EXPECT_EQ(MChunkRows(a, 1), 384);  // 36 tiles: 4 items per thread with one chunk
  EXPECT_EQ(MChunkRows(a, 16), 384);  // 64 items wanted: 2 chunks of 512 rows, capped at 384
  a.tiles = 4;
  EXPECT_EQ(MChunkRows(a, 4), 288);   // 16 items wanted: 4 chunks of 256 rows, rounded up to 288
  a.M = 80;
  EXPECT_EQ(MChunkRows(a, 2), 80);  // one chunk of all rows
  a.M = 97;
  a.tiles = 1;
  EXPECT_EQ(MChunkRows(a, 2), 96);  // 8 chunks wanted: the floor
}

// ---------------------------------------------------------------- prescaled operands

float Pow2(int e) { return std::ldexp(1.0f, e); }

TEST(BlockGemm, PrescaleGuardBounds) {
  const float ok[] = {2 * Pow2(-5), 2 * Pow2(0), 2 * Pow2(3)};
  EXPECT_TRUE(BlockPrescaleExact(-20, 0, ok, 3));
  EXPECT_TRUE(BlockPrescaleExact(-95, 85, ok, 3));   // -95-5 = -100, 85+3 = 88
  EXPECT_FALSE(BlockPrescaleExact(-96, 85, ok, 3));  // -101
  EXPECT_FALSE(BlockPrescaleExact(-20, 88, ok, 3));  // 91
  EXPECT_FALSE(BlockPrescaleExact(-101, -101, ok + 1, 1));
  EXPECT_FALSE(BlockPrescaleExact(91, 91, ok + 1, 1));
  EXPECT_TRUE(BlockPrescaleExact(-100, -100, ok + 1, 1));
  EXPECT_TRUE(BlockPrescaleExact(90, 90, ok + 1, 1));
  EXPECT_FALSE(BlockPrescaleExact(-1000, 1000, ok, 3));  // PackedFp8/PackedFp4 defaults
  EXPECT_FALSE(BlockPrescaleExact(1, 0, ok, 3));         // empty range
  // Activation scales (2·s_act): e_a = -100 and 90 pass, -101 and 91 fail;
  // anything but a positive normal power of two fails.
  for (const auto& [sa, pass] : std::vector<std::pair<float, bool>>{{2 * Pow2(-100), true},
                                                                    {2 * Pow2(90), true},
                                                                    {2 * Pow2(-101), false},
                                                                    {2 * Pow2(91), false},
                                                                    {3.0f, false},
                                                                    {-2.0f, false},
                                                                    {0.0f, false},
                                                                    {Pow2(-140), false},
                                                                    {std::nanf(""), false},
                                                                    {INFINITY, false}}) {
    const float v[] = {2.0f, sa};
    EXPECT_EQ(BlockPrescaleExact(0, 0, v, 2), pass) << sa;
  }
}

TEST(BlockGemm, PackedScaleExponentRange) {
  const int64_t N = 70, K = 64;
  std::vector<uint8_t> w8(N * K, 0x38), w4(N * K / 2, 0x21);
  std::vector<uint8_t> s8(((N + 31) / 32) * (K / 32), 120), s4(N * (K / 32), 127);
  s8[1] = 100, s8[4] = 130, s4[7] = 27, s4[100] = 217;
  PackedFp8 p8 = PackFp8({w8.data(), s8.data(), N, K, 32});
  EXPECT_EQ(p8.scale_exp_lo, -27);
  EXPECT_EQ(p8.scale_exp_hi, 3);
  PackedFp4 p4 = PackFp4({w4.data(), s4.data(), N, K});
  EXPECT_EQ(p4.scale_exp_lo, -100);
  EXPECT_EQ(p4.scale_exp_hi, 90);
  s8[2] = 0xFF;  // a NaN scale: the range stays at the defaults, which fail the guard
  p8 = PackFp8({w8.data(), s8.data(), N, K, 32});
  EXPECT_FALSE(BlockPrescaleExact(p8.scale_exp_lo, p8.scale_exp_hi, nullptr, 0));
}

// Activations whose every ab-block has the scale 2^e_a exactly (one value
// of magnitude 256·2^e_a, the rest below 128·2^e_a: Pow2Ceil(256/448) = 1),
// e_a drawn from [ea_lo, ea_hi] per block.
std::vector<float> ActsWithScales(int64_t M, int64_t K, int ab, int ea_lo, int ea_hi, uint64_t seed) {
  std::vector<float> x = Acts(M * K, seed);
  std::mt19937_64 rng(seed + 1);
  for (int64_t b = 0; b < M * K / ab; ++b) {
    const int e = ea_lo + static_cast<int>(rng() % static_cast<uint64_t>(ea_hi - ea_lo + 1));
    float* blk = x.data() + b * ab;
    blk[rng() % ab] = (rng() & 1) ? 256.0f : -256.0f;
    for (int i = 0; i < ab; ++i) blk[i] *= Pow2(e);
  }
  return x;
}

struct PrescaleCase {
  int ew_lo, ew_hi, ea_lo, ea_hi;
  bool prescaled;  // whether the guard lets the call take the prescaled folds
};
const std::vector<PrescaleCase> kPrescaleCases = {
    {-17, 0, -8, 8, true},     // a checkpoint's usual range
    {-100, -87, 0, 0, true},   // lowest e_w, e_a + e_w = -100
    {-101, -87, 0, 0, false},  // one below
    {73, 90, 0, 0, true},      // highest e_w
    {73, 91, 0, 0, false},     // one above
    {-90, -80, -10, -5, true}, // e_a + e_w down to -100
    {-90, -80, -11, -5, false}};

void RefLinear(const float* x, int64_t M, const ref::Fp8Weight& v, int ab, float* y) {
  ref::LinearFp8(x, M, v, ab, y);
}
void RefLinear(const float* x, int64_t M, const ref::Fp4Weight& v, int ab, float* y) {
  ref::LinearFp4(x, M, v, ab, y);
}
void FastLinear(const float* x, int64_t M, const PackedFp8& p, int ab, float* y) { LinearFp8(x, M, p, ab, y); }
void FastLinear(const float* x, int64_t M, const PackedFp4& p, int ab, float* y) { LinearFp4(x, M, p, ab, y); }

// Whether the guard takes the prescaled folds for this call is c.prescaled,
// and the kernel gives the reference's bits.
template <typename View, typename Packed>
void CheckPrescaled(const PrescaleCase& c, const View& view, const Packed& p, const std::vector<float>& x,
                    const Shape& s) {
  ASSERT_FALSE(p.use_ref);
  std::vector<float> q(s.M * s.K), sa(s.M * (s.K / s.ab));
  QuantizeActRows(x.data(), s.M, s.K, s.ab, q.data(), sa.data());
  EXPECT_EQ(BlockPrescaleExact(p.scale_exp_lo, p.scale_exp_hi, sa.data(), s.M * (s.K / s.ab)), c.prescaled);
  std::vector<float> want(s.M * s.N), got(s.M * s.N, -1.0f);
  RefLinear(x.data(), s.M, view, s.ab, want.data());
  FastLinear(x.data(), s.M, p, s.ab, got.data());
  EXPECT_TRUE(SameBits(got, want));
}

TEST(BlockGemm, PrescaledOperandsBitIdentical) {
  const std::vector<Shape> shapes = {{16, 64, 64, 32}, {97, 130, 96, 32}, {23, 72, 256, 128}};
  ForEachTargetAndThreads([&] {
    uint64_t seed = 300;
    for (const PrescaleCase& c : kPrescaleCases) {
      for (const Shape& s : shapes) {
        SCOPED_TRACE("e_w [" + std::to_string(c.ew_lo) + ", " + std::to_string(c.ew_hi) + "] e_a [" +
                     std::to_string(c.ea_lo) + ", " + std::to_string(c.ea_hi) + "] M=" + std::to_string(s.M) +
                     " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " ab=" + std::to_string(s.ab));
        std::mt19937_64 rng(++seed);
        const auto scale_byte = [&](int i) {
          // both ends of the range, then random inside it
          const int e = i == 0 ? c.ew_lo : i == 1 ? c.ew_hi : c.ew_lo + static_cast<int>(rng() % (c.ew_hi - c.ew_lo + 1));
          return static_cast<uint8_t>(127 + e);
        };
        const std::vector<float> x = ActsWithScales(s.M, s.K, s.ab, c.ea_lo, c.ea_hi, seed + 100);
        {
          SCOPED_TRACE("fp8");
          std::vector<uint8_t> w(s.N * s.K), sc(((s.N + s.ab - 1) / s.ab) * (s.K / s.ab));
          for (auto& v : w) do v = static_cast<uint8_t>(rng()); while (E4M3IsNaN(v));
          for (size_t i = 0; i < sc.size(); ++i) sc[i] = scale_byte(static_cast<int>(i));
          const ref::Fp8Weight view{w.data(), sc.data(), s.N, s.K, s.ab};
          CheckPrescaled(c, view, PackFp8(view), x, s);
        }
        {
          SCOPED_TRACE("fp4");
          std::vector<uint8_t> w(s.N * s.K / 2), sc(s.N * (s.K / 32));
          for (auto& v : w) v = static_cast<uint8_t>(rng());
          for (size_t i = 0; i < sc.size(); ++i) sc[i] = scale_byte(static_cast<int>(i));
          const ref::Fp4Weight view{w.data(), sc.data(), s.N, s.K};
          CheckPrescaled(c, view, PackFp4(view), x, s);
        }
      }
    }
  });
}

}  // namespace
}  // namespace deepinfer::cpu
