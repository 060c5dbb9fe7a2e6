// The fast CPU kernels (kernels/cpu/cpu_ops.h) against the scalar reference
// operators (kernels/ref/ref_ops.h): bit-identical outputs on random inputs
// for every compiled Highway target this CPU supports, for M = 1, odd M, M
// spanning several row chunks, odd N (padding rows), both thread counts, and
// special values. Also checks that the tests can see an order change (the
// in-block FP32 sums really are inexact on these inputs).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "format/numerics.h"
#include "base/parallel.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"

namespace deepinfer::cpu {
namespace {

// Bitwise equality, any NaN equal to any NaN (payloads are not specified).
::testing::AssertionResult SameBits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (FloatBits(got[i]) != FloatBits(want[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ; first at " << first << ": got "
                                       << got[first] << " want " << want[first];
}

// BF16-exact activations with a wide dynamic range inside each 32-block (so
// quantised values span the E4M3 subnormals and in-block sums round), some
// exact zeros and negative zeros.
std::vector<float> RandomActs(int64_t n, uint64_t seed, float lo_exp = -12.0f, float hi_exp = 6.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> e(lo_exp, hi_exp), u(1.0f, 2.0f);
  std::vector<float> x(n);
  for (auto& v : x) {
    const uint64_t r = rng();
    if (r % 29 == 0) { v = (r & 64) ? -0.0f : 0.0f; continue; }
    v = RoundBf16(std::ldexp(u(rng), static_cast<int>(e(rng))) * ((r & 1) ? -1.0f : 1.0f));
  }
  return x;
}

std::vector<uint8_t> RandomE4M3(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> w(n);
  for (auto& c : w) {
    do c = static_cast<uint8_t>(rng()); while (E4M3IsNaN(c));
  }
  return w;
}

std::vector<uint8_t> RandomScales(int64_t n, uint64_t seed, int lo = 110, int hi = 135) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> s(n);
  for (auto& b : s) b = static_cast<uint8_t>(lo + rng() % (hi - lo + 1));
  return s;
}

std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed) {
  const std::vector<float> f = RandomActs(n, seed, -9.0f, 2.0f);
  std::vector<uint16_t> w(n);
  for (int64_t i = 0; i < n; ++i) w[i] = FloatToBf16(f[i]);
  return w;
}

// Runs body once per available dispatch target (and restores dispatch).
template <typename F>
void ForEachTarget(F&& body) {
  const std::vector<int64_t> targets = AvailableTargets();
  ASSERT_FALSE(targets.empty());
  SetMinParallelMacs(0);  // exercise the OpenMP split even on these small shapes
  // 3 threads: calls with fewer tiles than threads (N <= 128) split their rows
  // into 16-row slices (linear_common.h ParallelItems).
  const int threads = NumThreads();
  SetNumThreads(3);
  for (int64_t t : targets) {
    ForceTarget(t);
    SCOPED_TRACE("target " + TargetName(t));
    EXPECT_EQ(ActiveTarget(), TargetName(t));
    body();
  }
  ForceTarget(0);
  ApplyTargetFromEnv();  // back to DEEPINFER_TARGET's restriction, when set
  SetMinParallelMacs(int64_t{1} << 20);
  SetNumThreads(threads);
}

struct Shape {
  int64_t M, N, K;
};
const std::vector<Shape> kShapes = {
    {1, 64, 32}, {1, 100, 96}, {2, 130, 256}, {3, 17, 64}, {7, 64, 160}, {13, 200, 128}, {100, 70, 96}, {1, 1, 32},
    // M = 1 with more tiles than threads (no row slices): the AVX2 GEMVs over
    // whole 64-row tiles (FP8, BF16, the FP4 product tables), a 8-row last tile
    {1, 200, 160},
    // M >= 16: the block GEMM (weights converted once per tile and K block)
    {16, 64, 64}, {41, 130, 128}, {203, 24, 64}};

TEST(CpuKernels, TargetsIncludeBaseline) {
  if (std::getenv("DEEPINFER_TARGET") != nullptr) GTEST_SKIP() << "DEEPINFER_TARGET restricts the targets";
  const std::vector<int64_t> t = AvailableTargets();
  ASSERT_FALSE(t.empty());
  // The fallback (EMU128 or SCALAR) is always compiled and supported.
  const std::string last = TargetName(t.back());
  EXPECT_TRUE(last == "EMU128" || last == "SCALAR") << last;
}

TEST(CpuKernels, QuantizeActRowsMatchesScalarQuantiser) {
  const int64_t K = 256;
  std::vector<float> x = RandomActs(8 * K, 11);
  // Row 1: ties on the E4M3 grid (x/s exactly half-way), subnormal ties, and
  // the clamp edge; row 2: tiny values (amax floor 1e-4); row 3: huge values.
  for (int64_t k = 0; k < K; ++k) {
    const float s = 1.0f;  // with amax = 448 the scale is 1
    const float ties[] = {448.0f, 17.0f, 9.0f, 4.25f, 0.0146484375f /* 7.5·2^-9 */, 0.0009765625f /* 0.5·2^-9 */,
                          -13.0f, 3.0f * 0.0009765625f, 240.0f, 432.0f, -432.0f, 0.5f};
    x[K + k] = ties[k % 12] * s;
    x[2 * K + k] = std::ldexp(1.0f + (k % 7) / 8.0f, -20 - static_cast<int>(k % 9)) * ((k & 1) ? -1.0f : 1.0f);
    x[3 * K + k] = std::ldexp(1.0f + (k % 5) / 4.0f, 100 + static_cast<int>(k % 20));
  }
  x[4 * K + 5] = std::nanf("");                              // row 4: NaN → scalar path
  x[5 * K + 7] = -std::numeric_limits<float>::infinity();    // row 5: −Inf → scalar path
  const int64_t M = 8;
  ForEachTarget([&] {
    for (int B : {32, 128}) {
      std::vector<float> q(M * K), sa(M * K / B);
      QuantizeActRows(x.data(), M, K, B, q.data(), sa.data());
      std::vector<uint8_t> codes(K), sb(K / B);
      std::vector<float> want_q(M * K), want_sa(M * K / B);
      for (int64_t m = 0; m < M; ++m) {
        QuantizeActE4M3(x.data() + m * K, K, B, codes.data(), sb.data());
        for (int64_t k = 0; k < K; ++k) want_q[m * K + k] = E4M3ToFloat(codes[k]) * 0x1p119f;
        for (int64_t b = 0; b < K / B; ++b) want_sa[m * (K / B) + b] = E8M0ToFloat(sb[b]) * 2.0f;
      }
      EXPECT_TRUE(SameBits(q, want_q)) << "B=" << B;
      EXPECT_TRUE(SameBits(sa, want_sa)) << "B=" << B;
    }
  });
}

// The e4m3-ieee activation quantiser (maximum 224): the fast kernel is
// bit-identical to the scalar QuantizeActE4M3(..., kE4M3Ieee) on the same rows
// (ties, subnormal ties, the 224 / 240 / 448 edges, tiny and huge rows, NaN
// and −Inf rows), every code is at most 224 in magnitude (no exponent field
// 15) and every scale is exactly twice the standard mode's.
TEST(CpuKernels, QuantizeActRowsIeeeMatchesScalarQuantiser) {
  const int64_t K = 256;
  std::vector<float> x = RandomActs(8 * K, 12);
  for (int64_t k = 0; k < K; ++k) {
    const float edges[] = {224.0f, 240.0f, 448.0f, 216.0f /* tie 208|224 at s = 1 */, 232.0f,
                           0.0146484375f /* 7.5·2^-9 */, 0.0009765625f /* 0.5·2^-9 */, -3.0f * 0.0009765625f,
                           std::nextafter(224.0f, 300.0f), -208.0f, 0.5f, 17.0f};
    x[K + k] = edges[k % 12];
    x[2 * K + k] = std::ldexp(1.0f + (k % 7) / 8.0f, -20 - static_cast<int>(k % 9)) * ((k & 1) ? -1.0f : 1.0f);
    x[3 * K + k] = std::ldexp(1.0f + (k % 5) / 4.0f, 100 + static_cast<int>(k % 20));
    x[6 * K + k] = (k % 32 == 0) ? 224.0f : std::ldexp(1.0f + (k % 3) / 8.0f, -2 - static_cast<int>(k % 11));
  }
  x[4 * K + 5] = std::nanf("");
  x[5 * K + 7] = -std::numeric_limits<float>::infinity();
  const int64_t M = 8;
  ForEachTarget([&] {
    for (int B : {32, 128}) {
      std::vector<float> q(M * K), sa(M * K / B);
      QuantizeActRows(x.data(), M, K, B, q.data(), sa.data(), Fp8Format::kE4M3Ieee);
      std::vector<uint8_t> codes(K), sb(K / B), codes_std(K), sb_std(K / B);
      std::vector<float> want_q(M * K), want_sa(M * K / B);
      for (int64_t m = 0; m < M; ++m) {
        QuantizeActE4M3(x.data() + m * K, K, B, codes.data(), sb.data(), Fp8Format::kE4M3Ieee);
        QuantizeActE4M3(x.data() + m * K, K, B, codes_std.data(), sb_std.data());
        for (int64_t k = 0; k < K; ++k) {
          want_q[m * K + k] = E4M3ToFloat(codes[k]) * 0x1p119f;
          EXPECT_TRUE((codes[k] & 0x7F) <= 0x76 || codes[k] == 0x7F) << "row " << m << " k " << k;
        }
        for (int64_t b = 0; b < K / B; ++b) {
          want_sa[m * (K / B) + b] = E8M0ToFloat(sb[b]) * 2.0f;
          if (sb_std[b] != 0xFF) {
            EXPECT_EQ(sb[b], sb_std[b] + 1) << "row " << m << " block " << b;
          }
        }
      }
      EXPECT_TRUE(SameBits(q, want_q)) << "B=" << B;
      EXPECT_TRUE(SameBits(sa, want_sa)) << "B=" << B;
      // The modes really differ on these rows (a test that could not fail otherwise).
      std::vector<float> q_std(M * K), sa_std(M * K / B);
      QuantizeActRows(x.data(), M, K, B, q_std.data(), sa_std.data());
      EXPECT_FALSE(SameBits(q_std, q)) << "B=" << B;
    }
  });
}

void CheckFp8(int64_t M, int64_t N, int64_t K, int B, int act_block, uint64_t seed,
              Fp8Format fmt = Fp8Format::kE4M3FN) {
  const int64_t sc = (K + B - 1) / B;
  std::vector<uint8_t> w = RandomE4M3(N * K, seed);
  std::vector<uint8_t> s = RandomScales(((N + B - 1) / B) * sc, seed + 1);
  if (fmt == Fp8Format::kE4M3Ieee) {  // the load-time transform (weights.h)
    HalveE4M3Codes(w.data(), N * K, w.data());
    for (auto& b : s) ASSERT_TRUE(RaiseE8M0ForIeee(b, &b));
  }
  const std::vector<float> x = RandomActs(M * K, seed + 2);
  const ref::Fp8Weight view{w.data(), s.data(), N, K, B};
  std::vector<float> want(M * N), got(M * N, -1.0f);
  ref::LinearFp8(x.data(), M, view, act_block, want.data(), fmt);
  const PackedFp8 p = PackFp8(view);
  ASSERT_FALSE(p.use_ref);
  LinearFp8(x.data(), M, p, act_block, got.data(), fmt);
  int64_t first = -1;
  for (int64_t i = 0; i < M * N && first < 0; ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0) first = i;
  EXPECT_TRUE(SameBits(got, want)) << "M=" << M << " N=" << N << " K=" << K << " B=" << B << " first mismatch: row "
                                   << (first < 0 ? -1 : first / N) << " col " << (first < 0 ? -1 : first % N)
                                   << " got " << (first < 0 ? 0.0f : got[first]) << " want "
                                   << (first < 0 ? 0.0f : want[first]);
}

// Every FP8 and FP4 check runs with the BF16 pair-dot paths (cpu_ops.h
// Bf16DotSupported: AVX-512 CPUs with AVX512_BF16) on and off, so both
// AVX-512 paths are covered on such a CPU.
template <typename F>
void WithAndWithoutBf16Dot(F&& f) {
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "fp4 bf16 dot on" : "fp4 bf16 dot off");
    SetBf16Dot(on);
    f();
  }
  SetBf16Dot(true);
}

TEST(CpuKernels, LinearFp8BitIdentical) {
  WithAndWithoutBf16Dot([&] {
    ForEachTarget([&] {
      uint64_t seed = 100;
      for (const Shape& sh : kShapes) CheckFp8(sh.M, sh.N, sh.K, 32, 32, seed += 7);
      CheckFp8(5, 130, 256, 128, 128, 900);  // V4 style 128×128 blocks
      CheckFp8(3, 300, 384, 128, 128, 901);
      // M >= 96 (the BF16 pair-dot GEMM where supported): 128- and 64-wide
      // activation blocks, two m-chunks.
      CheckFp8(100, 130, 256, 128, 128, 902);
      CheckFp8(97, 70, 64, 64, 64, 903);
      CheckFp8(96, 64, 96, 32, 32, 904);
    });
  });
}

TEST(CpuKernels, LinearFp8IeeeBitIdentical) {
  WithAndWithoutBf16Dot([&] {
    ForEachTarget([&] {
      uint64_t seed = 500;
      for (const Shape& sh : kShapes) CheckFp8(sh.M, sh.N, sh.K, 32, 32, seed += 7, Fp8Format::kE4M3Ieee);
      CheckFp8(5, 130, 256, 128, 128, 950, Fp8Format::kE4M3Ieee);
    });
  });
}

void CheckFp4(int64_t M, int64_t N, int64_t K, int act_block, uint64_t seed, Fp8Format fmt = Fp8Format::kE4M3FN) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> w(N * K / 2);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const std::vector<uint8_t> s = RandomScales(N * (K / 32), seed + 1);
  const std::vector<float> x = RandomActs(M * K, seed + 2);
  const ref::Fp4Weight view{w.data(), s.data(), N, K};
  std::vector<float> want(M * N), got(M * N, -1.0f);
  ref::LinearFp4(x.data(), M, view, act_block, want.data(), fmt);
  const PackedFp4 p = PackFp4(view);
  ASSERT_FALSE(p.use_ref);
  LinearFp4(x.data(), M, p, act_block, got.data(), fmt);
  EXPECT_TRUE(SameBits(got, want)) << "M=" << M << " N=" << N << " K=" << K << " ab=" << act_block;
}

TEST(CpuKernels, LinearFp4BitIdentical) {
  WithAndWithoutBf16Dot([&] {
    ForEachTarget([&] {
      uint64_t seed = 200;
      for (const Shape& sh : kShapes) CheckFp4(sh.M, sh.N, sh.K, 32, seed += 7);
      CheckFp4(4, 96, 256, 128, 990);  // V4 style: 128-wide activation blocks
      CheckFp4(1, 64, 64, 64, 991);    // one group pair, 64-wide activation blocks
      CheckFp4(2, 192, 1056, 32, 992);  // odd number of groups (33)
    });
  });
}

TEST(CpuKernels, LinearFp4IeeeActivationsBitIdentical) {
  WithAndWithoutBf16Dot([&] {
    ForEachTarget([&] {
      uint64_t seed = 600;
      for (const Shape& sh : kShapes) CheckFp4(sh.M, sh.N, sh.K, 32, seed += 7, Fp8Format::kE4M3Ieee);
    });
  });
}

// The BF16 pair-dot path at the edges of the scaled operand range: the
// largest and smallest E4M3 activations of a block (448 and the subnormal
// 2^-9 relative to the block maximum) against every E2M1 code, sums that
// round at every step (large then tiny products), and non-finite
// activations (which must fall back and still match the reference).
TEST(CpuKernels, LinearFp4Bf16DotEdgeValues) {
  if (!Bf16DotSupported()) GTEST_SKIP() << "this CPU has no AVX512_BF16 (or it failed the self-check)";
  const int64_t N = 64, K = 256;
  std::vector<uint8_t> w(N * K / 2);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; k += 2) w[(n * K + k) / 2] = static_cast<uint8_t>(((n + k) & 15) | (((n * 3 + k / 2) & 15) << 4));
  const std::vector<uint8_t> s = RandomScales(N * (K / 32), 77);
  const ref::Fp4Weight view{w.data(), s.data(), N, K};
  const PackedFp4 p = PackFp4(view);
  for (int variant = 0; variant < 4; ++variant) {
    std::vector<float> x(3 * K);
    for (int64_t i = 0; i < 3 * K; ++i) {
      const int64_t k = i % K;
      switch (variant) {
        case 0: x[i] = (k % 32 == 0) ? 448.0f : std::ldexp(1.0f, -9) * static_cast<float>(1 + k % 7); break;
        case 1: x[i] = (k % 2 == 0) ? 3.0e4f : 1.0e-3f * static_cast<float>(k % 5); break;
        case 2: x[i] = (k % 3 == 0) ? -1.0f : std::ldexp(1.0f, -20); break;
        default: x[i] = (i == K + 5) ? std::numeric_limits<float>::infinity() : static_cast<float>(k % 9) - 4.0f; break;
      }
    }
    for (int64_t M : {1, 3}) {
      std::vector<float> want(M * N), got(M * N, -1.0f);
      ref::LinearFp4(x.data(), M, view, 32, want.data(), Fp8Format::kE4M3FN);
      LinearFp4(x.data(), M, p, 32, got.data(), Fp8Format::kE4M3FN);
      EXPECT_TRUE(SameBits(got, want)) << "variant " << variant << " M=" << M;
    }
  }
}

// Scalar pair order (what oneDNN's BF16 dot-product instructions do per
// lane): inside each pair (k, k+1) the k+1 product is added first.
// Not vectorised: g++ 12.2 at -O2 vectorises this two-statement reduction
// chain and reassociates it (wrong code; the result then differs from the
// sequential order written here on most inputs).
__attribute__((optimize("no-tree-vectorize"))) float PairsDot(const float* a, const float* b, int64_t K) {
  float acc = 0.0f;
  int64_t k = 0;
  for (; k + 1 < K; k += 2) {
    acc = acc + a[k + 1] * b[k + 1];
    acc = acc + a[k] * b[k];
  }
  if (k < K) acc = acc + a[k] * b[k];
  return acc;
}

std::vector<float> RefBf16Pairs(const std::vector<float>& x, int64_t M, const std::vector<uint16_t>& w, int64_t N,
                                int64_t K, int64_t ldx, int64_t x_off_per_group, int64_t R) {
  std::vector<float> y(M * N), wf(K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) wf[k] = Bf16ToFloat(w[n * K + k]);
      const float* xr = x.data() + m * ldx + (R > 0 ? (n / R) * x_off_per_group : 0);
      y[m * N + n] = RoundBf16(PairsDot(xr, wf.data(), K));
    }
  return y;
}

TEST(CpuKernels, LinearBf16AndHeadBitIdentical) {
  ForEachTarget([&] {
    uint64_t seed = 300;
    for (const Shape& sh : kShapes) {
      for (int64_t K : {sh.K, sh.K + 3}) {  // BF16 linears take any K
        seed += 7;
        const std::vector<uint16_t> w = RandomBf16(sh.N * K, seed);
        const std::vector<float> x = RandomActs(sh.M * K, seed + 1, -8.0f, 3.0f);
        const ref::Bf16Weight view{w.data(), sh.N, K};
        const PackedBf16 p = PackBf16(view);
        std::vector<float> want(sh.M * sh.N), got(sh.M * sh.N, -1.0f);
        ref::LinearBf16(x.data(), sh.M, view, want.data());
        LinearBf16(x.data(), sh.M, p, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "LinearBf16 M=" << sh.M << " N=" << sh.N << " K=" << K;
        LinearBf16(x.data(), sh.M, p, got.data(), /*pairs=*/true);
        EXPECT_TRUE(SameBits(got, RefBf16Pairs(x, sh.M, w, sh.N, K, K, 0, 0))) << "pairs";
        // Head-style: arbitrary FP32 inputs, FP32 outputs.
        std::vector<float> xf(sh.M * K);
        std::mt19937_64 rng(seed + 2);
        std::normal_distribution<float> nd(0.0f, 3.0f);
        for (auto& v : xf) v = nd(rng);
        ref::LinearF32Bf16W(xf.data(), sh.M, view, want.data());
        LinearF32Bf16W(xf.data(), sh.M, p, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "LinearF32Bf16W M=" << sh.M << " N=" << sh.N << " K=" << K;
      }
    }
  });
}

// BF16 GEMM with products that underflow (activations near 2^-126) or come
// near overflow: the FMA guard (linear_common.h Bf16FmaExact) must send
// these to the multiply-then-add path; same bits as the reference.
TEST(CpuKernels, LinearBf16ExtremeRangesBitIdentical) {
  ForEachTarget([&] {
    const int64_t M = 20, N = 70, K = 96;
    for (int c = 0; c < 3; ++c) {
      const float lo = c == 0 ? -128.0f : (c == 1 ? 110.0f : -20.0f), hi = c == 0 ? -110.0f : (c == 1 ? 127.0f : 20.0f);
      const std::vector<uint16_t> w = RandomBf16(N * K, 900 + c);
      std::vector<float> x = RandomActs(M * K, 910 + c, lo, hi);
      const ref::Bf16Weight view{w.data(), N, K};
      const PackedBf16 p = PackBf16(view);
      std::vector<float> want(M * N), got(M * N, -1.0f);
      ref::LinearBf16(x.data(), M, view, want.data());
      LinearBf16(x.data(), M, p, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "case " << c;
    }
  });
}

TEST(CpuKernels, GroupedLinearBf16BitIdentical) {
  ForEachTarget([&] {
    for (int64_t M : {1, 3, 9}) {
      const int groups = 4;
      const int64_t R = 64, Kg = 96;
      const std::vector<uint16_t> w = RandomBf16(groups * R * Kg, 400 + M);
      const std::vector<float> o = RandomActs(M * groups * Kg, 500 + M, -6.0f, 3.0f);
      const ref::Bf16Weight view{w.data(), groups * R, Kg};
      const PackedBf16 p = PackBf16(view);
      std::vector<float> want(M * groups * R), got(M * groups * R, -1.0f);
      ref::GroupedLinearBf16(o.data(), M, groups, view, want.data());
      GroupedLinearBf16(o.data(), M, groups, p, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "M=" << M;
      GroupedLinearBf16(o.data(), M, groups, p, got.data(), /*pairs=*/true);
      EXPECT_TRUE(SameBits(got, RefBf16Pairs(o, M, w, groups * R, Kg, groups * Kg, Kg, R))) << "pairs M=" << M;
    }
  });
}

// A row's result must not depend on M, on the other rows or on the threads.
TEST(CpuKernels, RowsIndependentOfBatchAndThreads) {
  const int64_t N = 192, K = 512, M = 37;
  const std::vector<uint8_t> w = RandomE4M3(N * K, 7);
  const std::vector<uint8_t> s = RandomScales((N / 32) * (K / 32), 8);
  const std::vector<float> x = RandomActs(M * K, 9);
  const PackedFp8 p = PackFp8({w.data(), s.data(), N, K, 32});
  std::vector<uint8_t> w4(N * K / 2);
  for (size_t i = 0; i < w4.size(); ++i) w4[i] = w[i];
  const std::vector<uint8_t> s4 = RandomScales(N * K / 32, 10);
  const PackedFp4 p4 = PackFp4({w4.data(), s4.data(), N, K});
  const int saved = omp_get_max_threads();
  std::vector<float> all8(M * N), all4(M * N);
  omp_set_num_threads(2);
  SetMinParallelMacs(0);
  LinearFp8(x.data(), M, p, 32, all8.data());
  LinearFp4(x.data(), M, p4, 32, all4.data());
  omp_set_num_threads(1);
  SetMinParallelMacs(int64_t{1} << 20);  // single rows: the serial path
  for (int64_t m = 0; m < M; m += 5) {
    std::vector<float> one(N);
    LinearFp8(x.data() + m * K, 1, p, 32, one.data());
    EXPECT_TRUE(SameBits(one, std::vector<float>(all8.begin() + m * N, all8.begin() + (m + 1) * N))) << m;
    LinearFp4(x.data() + m * K, 1, p4, 32, one.data());
    EXPECT_TRUE(SameBits(one, std::vector<float>(all4.begin() + m * N, all4.begin() + (m + 1) * N))) << m;
  }
  omp_set_num_threads(saved);
}

// The random inputs above are strong enough to notice a different summation
// order: summing each 32-block in reverse changes some outputs.
TEST(CpuKernels, InputsAreOrderSensitive) {
  const int64_t N = 256, K = 512;
  const std::vector<uint8_t> w = RandomE4M3(N * K, 21);
  const std::vector<float> x = RandomActs(K, 22);
  std::vector<uint8_t> q(K), sb(K / 32);
  QuantizeActE4M3(x.data(), K, 32, q.data(), sb.data());
  int64_t differ = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < K / 32; ++b) {
      float fwd = 0.0f, rev = 0.0f;
      for (int64_t k = b * 32; k < b * 32 + 32; ++k) fwd += E4M3ToFloat(q[k]) * E4M3ToFloat(w[n * K + k]);
      for (int64_t k = b * 32 + 31; k >= b * 32; --k) rev += E4M3ToFloat(q[k]) * E4M3ToFloat(w[n * K + k]);
      differ += FloatBits(fwd) != FloatBits(rev);
    }
  std::printf("order-sensitive block sums: %lld of %lld\n", static_cast<long long>(differ),
              static_cast<long long>(N * (K / 32)));
  EXPECT_GT(differ, 100) << "in-block sums were (almost) always exact: the test data is too tame";
}

TEST(CpuKernels, SpecialWeightsFallBackToScalar) {
  const int64_t M = 3, N = 64, K = 64;
  std::vector<uint8_t> w = RandomE4M3(N * K, 31);
  w[5 * K + 9] = 0x7F;  // NaN code
  const std::vector<uint8_t> s = RandomScales((N / 32) * (K / 32), 32);
  const std::vector<float> x = RandomActs(M * K, 33);
  const ref::Fp8Weight view{w.data(), s.data(), N, K, 32};
  const PackedFp8 p = PackFp8(view);
  EXPECT_TRUE(p.use_ref);
  std::vector<float> want(M * N), got(M * N);
  ref::LinearFp8(x.data(), M, view, 32, want.data());
  LinearFp8(x.data(), M, p, 32, got.data());
  EXPECT_TRUE(SameBits(got, want));
  EXPECT_TRUE(std::isnan(got[5]));
  // FP4 with a zero scale byte (2^-127) also takes the scalar path.
  std::vector<uint8_t> w4(N * K / 2, 0x77), s4 = RandomScales(N * K / 32, 34);
  s4[3] = 0;
  const PackedFp4 p4 = PackFp4({w4.data(), s4.data(), N, K});
  EXPECT_TRUE(p4.use_ref);
}

TEST(CpuKernels, NonFiniteActivationRowStaysIsolated) {
  const int64_t M = 3, N = 64, K = 64;
  const std::vector<uint8_t> w = RandomE4M3(N * K, 41);
  const std::vector<uint8_t> s = RandomScales(4, 42);
  std::vector<float> x = RandomActs(M * K, 43);
  x[K + 3] = std::nanf("");
  const ref::Fp8Weight view{w.data(), s.data(), N, K, 32};
  const PackedFp8 p = PackFp8(view);
  std::vector<float> want(M * N), got(M * N);
  ref::LinearFp8(x.data(), M, view, 32, want.data());
  ForEachTarget([&] {
    LinearFp8(x.data(), M, p, 32, got.data());
    EXPECT_TRUE(SameBits(got, want));
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_FALSE(std::isnan(got[n]));
      EXPECT_TRUE(std::isnan(got[N + n]));
    }
  });
}

}  // namespace
}  // namespace deepinfer::cpu

namespace deepinfer::cpu {
namespace {

TEST(CpuKernels, LinearF32BitIdentical) {
  ForEachTarget([&] {
    for (const Shape& sh : kShapes) {
      std::mt19937_64 rng(sh.M * 1000 + sh.N);
      std::normal_distribution<float> nd(0.0f, 2.0f);
      std::vector<float> w(sh.N * sh.K), x(sh.M * sh.K);
      for (auto& v : w) v = nd(rng);
      for (auto& v : x) v = nd(rng);
      const PackedF32 p = PackF32(w.data(), sh.N, sh.K);
      std::vector<float> want(sh.M * sh.N), got(sh.M * sh.N, -1.0f);
      ref::LinearF32(x.data(), sh.M, w.data(), sh.N, sh.K, want.data());
      LinearF32(x.data(), sh.M, p, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "M=" << sh.M << " N=" << sh.N << " K=" << sh.K;
    }
  });
}

TEST(CpuKernels, RouterBitIdentical) {
  const int64_t dim = 160, E = 24;
  const int topk = 4;
  ForEachTarget([&] {
    for (int64_t M : {1, 5}) {
      const std::vector<uint16_t> g = RandomBf16(E * dim, 600 + M);
      const std::vector<float> x = RandomActs(M * dim, 601 + M, -6.0f, 2.0f);
      std::vector<float> bias(E);
      std::mt19937_64 rng(602);
      for (auto& b : bias) b = static_cast<float>(rng() % 1000) / 5000.0f;
      std::vector<const float*> bp(M, bias.data());
      std::vector<int32_t> spv(M);
      for (int64_t m = 0; m < M; ++m) spv[m] = static_cast<int32_t>((m * 7) % (E + 1));  // vector/scalar split varies
      const ref::Bf16Weight view{g.data(), E, dim};
      const PackedBf16 p = PackBf16(view);
      for (bool norm : {false, true}) {
        std::vector<int32_t> wi(M * topk), gi(M * topk);
        std::vector<float> ww(M * topk), gw(M * topk);
        ref::Router(x.data(), M, view, bp.data(), topk, 1.0f, norm, 1.5f, spv.data(), wi.data(), ww.data());
        Router(x.data(), M, p, bp.data(), topk, 1.0f, norm, 1.5f, spv.data(), gi.data(), gw.data());
        EXPECT_EQ(gi, wi) << "M=" << M;
        EXPECT_TRUE(SameBits(gw, ww)) << "M=" << M;
      }
    }
  });
}

TEST(CpuKernels, HcMixesBitIdentical) {
  const int hc = 4;
  const int64_t d = 96, mix = (2 + hc) * hc;
  ForEachTarget([&] {
    for (int64_t M : {1, 3, 8}) {
      const std::vector<float> X = RandomActs(M * hc * d, 700 + M, -4.0f, 3.0f);
      std::mt19937_64 rng(701);
      std::normal_distribution<float> nd(0.0f, 0.05f);
      std::vector<float> fn(mix * hc * d), base(mix), scale = {0.7f, 1.1f, 0.9f};
      for (auto& v : fn) v = nd(rng);
      for (auto& v : base) v = nd(rng) * 10.0f;
      std::vector<int32_t> sig(M);
      for (int64_t r = 0; r < M; ++r) sig[r] = static_cast<int32_t>((r * 3) % (hc + 1));  // vector/scalar split varies
      const PackedF32 p = PackF32(fn.data(), mix, hc * d);
      std::vector<float> wp(M * hc), wq(M * hc), wc(M * hc * hc), gp(M * hc), gq(M * hc), gc(M * hc * hc);
      ref::HcMixes(X.data(), M, hc, d, fn.data(), base.data(), scale.data(), 1e-20f, 20, 1e-6f, sig.data(), wp.data(),
                   wq.data(), wc.data());
      HcMixes(X.data(), M, hc, d, p, base.data(), scale.data(), 1e-20f, 20, 1e-6f, sig.data(), gp.data(), gq.data(),
              gc.data());
      EXPECT_TRUE(SameBits(gp, wp)) << "pre M=" << M;
      EXPECT_TRUE(SameBits(gq, wq)) << "post M=" << M;
      EXPECT_TRUE(SameBits(gc, wc)) << "comb M=" << M;
    }
  });
}

TEST(CpuKernels, HcCollapseExpandBitIdentical) {
  // Elementwise along d: d not a multiple of the lanes, one row and many
  // (rows split over the team), general FP32 values (the products are not
  // exact: an FMA would show), NaN / ±Inf / huge values in a few elements.
  const int hc = 4;
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    ForEachTarget([&] {
      for (int64_t d : {1, 7, 96, 1030}) {
        for (int64_t M : {1, 3, 40}) {
          std::vector<float> X = RandomActs(M * hc * d, 900 + d + M, -6.0f, 6.0f);
          std::vector<float> v = RandomActs(M * d, 901 + d + M, -3.0f, 3.0f);
          std::vector<float> pre = RandomActs(M * hc, 902 + d, -1.0f, 2.0f);
          std::vector<float> post = RandomActs(M * hc, 903 + d, -1.0f, 2.0f);
          std::vector<float> comb = RandomActs(M * hc * hc, 904 + d, 0.0f, 1.0f);
          if (d >= 7) {
            X[3] = std::numeric_limits<float>::quiet_NaN();
            X[5] = std::numeric_limits<float>::infinity();
            v[d - 1] = -std::numeric_limits<float>::infinity();
            X[hc * d - 2] = 3.0e38f;
          }
          std::vector<float> wx(M * d), gx(M * d), wX(M * hc * d), gX(M * hc * d);
          ref::HcCollapse(X.data(), pre.data(), M, hc, d, wx.data());
          HcCollapse(X.data(), pre.data(), M, hc, d, gx.data());
          EXPECT_TRUE(SameBits(gx, wx)) << "collapse d=" << d << " M=" << M;
          ref::HcExpand(v.data(), X.data(), post.data(), comb.data(), M, hc, d, wX.data());
          HcExpand(v.data(), X.data(), post.data(), comb.data(), M, hc, d, gX.data());
          EXPECT_TRUE(SameBits(gX, wX)) << "expand d=" << d << " M=" << M;
        }
      }
    });
  }
  omp_set_num_threads(saved_threads);
}

TEST(CpuKernels, SleefExpfRowBitIdentical) {
  // Specials, the range limits, a stride over every bit pattern and a denser
  // stride over [-104, 1] (the attention's exp arguments), odd lengths.
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, 100.0f, -104.0f, std::nextafter(100.0f, 200.0f),
                          std::nextafter(-104.0f, -200.0f), std::nextafter(-104.0f, 0.0f), 88.72f, -87.33f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(), -1e30f, 1e-30f};
  auto BitsToFloat = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65521) x.push_back(BitsToFloat(static_cast<uint32_t>(u)));
  for (uint32_t u = FloatBits(1.0f); u > 0; u = u > 509 ? u - 509 : 0) x.push_back(BitsToFloat(u));
  for (uint32_t u = 0x80000000u; u <= FloatBits(-104.0f); u += 509) x.push_back(BitsToFloat(u));
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = ref::SleefExpf(x[i]);
  ForEachTarget([&] {
    for (size_t n : {x.size(), size_t{1}, size_t{7}, size_t{21}}) {
      std::vector<float> got(n, -1.0f);
      SleefExpfRow(x.data(), static_cast<int64_t>(n), got.data());
      EXPECT_TRUE(SameBits(got, std::vector<float>(want.begin(), want.begin() + static_cast<int64_t>(n))))
          << "n=" << n;
    }
  });
}

TEST(CpuKernels, SparseAttentionBitIdentical) {
  struct Case {
    int H;
    int64_t D;
    int32_t list_len;
    int keep;  // a slot holds a candidate with probability (keep-1)/keep; 0: every slot
  };
  const float inf = std::numeric_limits<float>::infinity();
  const int saved = omp_get_max_threads();
  ForEachTarget([&] {
    // H below, at and past the lanes; D not a whole number of vectors or
    // tiles; last chunks of 1..63 slots; n past the OpenMP split threshold;
    // many heads (130k outputs: a one-ulp change of a softmax sum shows
    // through the BF16 rounding of some of them).
    for (const Case& c : {Case{4, 128, 70, 3}, Case{16, 512, 200, 3}, Case{20, 72, 130, 3}, Case{1, 64, 5, 3},
                          Case{16, 512, 640, 0}, Case{17, 40, 1000, 4}, Case{3, 24, 71, 0}, Case{8, 8, 9, 2},
                          Case{33, 200, 575, 5}, Case{16, 520, 129, 3}, Case{5, 1, 64, 0}, Case{256, 512, 160, 3}}) {
      // variant 0: BF16 queries (as the model's), 1: special values, 2: FP32 queries (inexact q·k products)
      for (int variant = 0; variant < 3; ++variant) {
        std::mt19937_64 rng(800 + c.H + variant);
        // Candidates at ascending slots with gaps; chunk 1 (slots 64..127) left empty when the list is long.
        std::vector<int32_t> slots;
        for (int32_t s = 0; s < c.list_len; ++s) {
          if (c.list_len > 128 && s >= 64 && s < 128) continue;
          if (c.keep == 0 || rng() % c.keep != 0) slots.push_back(s);
        }
        const int n = static_cast<int>(slots.size());
        std::vector<uint16_t> rows = RandomBf16(n * c.D, 801 + c.H);
        std::vector<const uint16_t*> kv(n);
        for (int i = 0; i < n; ++i) kv[i] = rows.data() + i * c.D;
        std::vector<float> q = RandomActs(c.H * c.D, 802 + c.H, -3.0f, 2.0f);
        std::vector<float> sink(c.H);
        for (auto& s : sink) s = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 25.0f;
        if (variant == 1) {
          // Special values: a head of -inf scores, one of ±inf/NaN scores, one
          // with a NaN query element, one whose exps underflow, infinite sinks.
          for (int i = 0; i < n; ++i) rows[i * c.D] = FloatToBf16(0.5f + static_cast<float>(i % 3));
          q[0] = -inf;
          if (c.H > 1) q[c.D] = 1e38f, q[c.D + c.D / 2] = 1e38f;
          if (c.H > 2) q[2 * c.D + c.D - 1] = std::numeric_limits<float>::quiet_NaN();
          if (c.H > 3)
            for (int64_t d = 0; d < c.D; ++d) q[3 * c.D + d] *= 300.0f;
          sink[0] = -inf;
          if (c.H > 4) sink[4] = inf;
        }
        if (variant == 2)
          for (auto& v : q) v *= 1.1f;
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
        std::vector<float> want(c.H * c.D);
        ref::SparseAttention(q.data(), c.H, c.D, kv.data(), slots.data(), n, c.list_len, sink.data(), scale,
                             want.data());
        for (int threads : {1, 2}) {
          omp_set_num_threads(threads);
          std::vector<float> got(c.H * c.D, -1.0f);
          SparseAttention(q.data(), c.H, c.D, kv.data(), slots.data(), n, c.list_len, sink.data(), scale, got.data());
          EXPECT_TRUE(SameBits(got, want)) << "H=" << c.H << " D=" << c.D << " n=" << n << " list_len=" << c.list_len
                                           << " variant=" << variant << " threads=" << threads;
        }
      }
    }
  });
  omp_set_num_threads(saved);
}

// The V4.1 indexer's scalar score loop (model.cc ForwardPass::Indexer), keys row-major.
void IndexerScoresOracle(const float* q, const float* w, int64_t nh, int64_t ID, const float* keys, int64_t n,
                         float* score) {
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int64_t h = 0; h < nh; ++h) {
      const float* qh = q + h * ID;
      const float* kj = keys + j * ID;
      float dot = 0.0f;
      for (int64_t c = 0; c < ID; ++c) dot += qh[c] * kj[c];
      const float rl = std::max(RoundBf16(dot), 0.0f);
      acc += RoundBf16(rl * w[h]);
    }
    score[j] = RoundBf16(acc);
  }
}

TEST(CpuKernels, IndexerScoresBitIdentical) {
  struct Case {
    int64_t nh, ID, n;
    // 0 none, 1 NaN key, 2 NaN query, 3 NaN weight, 4 underflowing products, 5 Inf / Inf−Inf, 6 zero keys,
    // 7 keys whose score an FMA would change
    int special;
  };
  std::vector<Case> cases;
  for (int64_t n : {1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 129, 300})
    cases.push_back({16, 128, n, 0});
  for (int sp = 1; sp <= 7; ++sp) cases.push_back({16, 128, 77, sp});
  cases.push_back({3, 5, 21, 0});
  cases.push_back({1, 1, 9, 0});
  cases.push_back({5, 33, 70, 4});
  ForEachTarget([&] {
    for (const Case& cs : cases) {
      const int64_t nh = cs.nh, ID = cs.ID, n = cs.n;
      const int64_t E = n + 5;  // keys past n exist and must not matter
      std::mt19937_64 rng(900 + n * 7 + cs.special * 131 + nh);
      // q: FP4 E2M1 values × a power-of-two scale per 32 (the FP4 QDQ'd query); k: BF16; w: signed BF16.
      static const float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
      std::vector<float> q(nh * ID), w(nh), keys(E * ID);
      const int qexp_lo = cs.special == 4 ? -80 : -6;
      for (int64_t g = 0; g < nh * ID; g += 32) {
        const int e = qexp_lo + static_cast<int>(rng() % 6);
        for (int64_t t = g; t < std::min(nh * ID, g + 32); ++t)
          q[t] = std::ldexp(kE2M1[rng() % 8], e) * ((rng() & 1) ? -1.0f : 1.0f);
      }
      const std::vector<uint16_t> kb = RandomBf16(E * ID, 901 + n);
      for (int64_t t = 0; t < E * ID; ++t) keys[t] = Bf16ToFloat(kb[t]);
      if (cs.special == 4)  // products near and below the FP32 subnormal range: dots that round to ±0 / subnormals
        for (auto& k : keys) k = RoundBf16(std::ldexp(k, -62));
      for (auto& v : w) v = RoundBf16(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 700.0f);
      switch (cs.special) {
        case 1:
          keys[5 * ID + 3] = BitsFloat(0x7FC10000u);
          keys[40 * ID + 0] = BitsFloat(0xFFC30000u);
          break;
        case 2: q[2 * ID + 7] = BitsFloat(0xFFE50000u); break;
        case 3: w[4] = BitsFloat(0x7FC70000u); break;
        case 5:
          for (int64_t c = 0; c < ID; ++c) keys[9 * ID + c] = BitsFloat(0x7F7F0000u) * ((c & 1) ? -1.0f : 1.0f);
          keys[12 * ID + 1] = std::numeric_limits<float>::infinity();
          keys[13 * ID + 2] = -std::numeric_limits<float>::infinity();
          break;
        case 6:
          for (int64_t j : {0, 20, 76})
            for (int64_t c = 0; c < ID; ++c) keys[j * ID + c] = (c & 1) ? -0.0f : 0.0f;
          break;
        case 7:
          // q_h = (2^-75, 2^-75, 2^-75, 0, ...); keys 3 and 50: (1.5·2^-58, -2^-74, 2^-75, ...): the dot is
          // 3·2^-134 − 2^-149, then + 2^-150, which the multiply rounds to 0 (bf16(dot) = 2^-133) but an
          // FMA adds (tie to even: 3·2^-134, bf16 2^-132).
          for (int64_t h = 0; h < nh; ++h)
            for (int64_t c = 0; c < ID; ++c) q[h * ID + c] = c < 3 ? std::ldexp(1.0f, -75) : 0.0f;
          for (auto& v : w) v = std::fabs(v);
          for (int64_t j : {3, 50}) {
            keys[j * ID + 0] = std::ldexp(1.5f, -58);
            keys[j * ID + 1] = -std::ldexp(1.0f, -74);
            keys[j * ID + 2] = std::ldexp(1.0f, -75);
          }
          break;
        default: break;
      }
      std::vector<float> kt((E + kIndexKeyBlock - 1) / kIndexKeyBlock * kIndexKeyBlock * ID, 0.0f);
      for (int64_t j = 0; j < E; ++j) {
        std::vector<uint16_t> row(ID);
        for (int64_t c = 0; c < ID; ++c) row[c] = static_cast<uint16_t>(FloatBits(keys[j * ID + c]) >> 16);
        PackIndexKey(row.data(), j, ID, kt.data());
      }
      std::vector<float> want(n), got(n + 1, 42.0f);
      IndexerScoresOracle(q.data(), w.data(), nh, ID, keys.data(), n, want.data());
      IndexerScores(q.data(), w.data(), nh, ID, kt.data(), n, got.data());
      EXPECT_EQ(FloatBits(got[n]), FloatBits(42.0f)) << "wrote past n=" << n;
      got.resize(n);
      int64_t bad = 0, first = -1;
      for (int64_t j = 0; j < n; ++j)
        if (FloatBits(got[j]) != FloatBits(want[j]) && bad++ == 0) first = j;  // NaN payloads too
      EXPECT_EQ(bad, 0) << "nh=" << nh << " ID=" << ID << " n=" << n << " special=" << cs.special << " first at "
                        << first << ": got " << (first >= 0 ? got[first] : 0) << " want "
                        << (first >= 0 ? want[first] : 0);
      if (cs.special == 1) {
        EXPECT_TRUE(std::isnan(want[5]) && std::isnan(want[40]));
      }
      if (cs.special == 7) {  // the test sees an FMA
        std::vector<float> fma(n);
        for (int64_t j = 0; j < n; ++j) {
          float acc = 0.0f;
          for (int64_t h = 0; h < nh; ++h) {
            float dot = 0.0f;
            for (int64_t c = 0; c < ID; ++c) dot = std::fma(q[h * ID + c], keys[j * ID + c], dot);
            acc += RoundBf16(std::max(RoundBf16(dot), 0.0f) * w[h]);
          }
          fma[j] = RoundBf16(acc);
        }
        EXPECT_NE(FloatBits(fma[3]), FloatBits(want[3]));
        EXPECT_NE(FloatBits(fma[50]), FloatBits(want[50]));
      }
      if (cs.special == 4) {  // the inputs really reach -0.0 after the rounding (std::max keeps it)
        int64_t neg_zero = 0;
        for (int64_t j = 0; j < n; ++j)
          for (int64_t h = 0; h < nh; ++h) {
            float dot = 0.0f;
            for (int64_t c = 0; c < ID; ++c) dot += q[h * ID + c] * keys[j * ID + c];
            neg_zero += FloatBits(RoundBf16(dot)) == 0x80000000u;
          }
        EXPECT_GT(neg_zero, 0);
      }
    }
  });
}

}  // namespace
}  // namespace deepinfer::cpu
