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
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "format/numerics.h"
#include "base/alloc_count.h"
#include "base/error.h"
#include "base/parallel.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/linear_common.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"

#include "cpu_test_util.h"

namespace deepinfer::cpu {
namespace {

// The decode step plan's reservation (cpu_ops.h ReserveLinearScratch): after
// it, on every thread of the team, calls of up to that many rows allocate
// nothing on any target (the AVX2 block GEMM's scratch from 16 rows included).
// HeapAllocations() stays 0 in sanitizer builds, where this checks nothing.
TEST(CpuKernels, ReservedLinearScratchMakesLaterCallsAllocateNothing) {
  // N = 512 (8 tiles): from 97 rows the AVX2 block GEMM takes m-chunks of
  // up to 384 rows (linear_common.h MChunkRows), whose accumulators the
  // reservation must cover too.
  const int64_t N = 512, K = 512, maxM = 400;
  const std::vector<uint8_t> w4 = RandomE4M3(N * K / 2, 50), s4 = RandomScales(N * (K / 32), 51);
  const std::vector<uint8_t> w8 = RandomE4M3(N * K, 52), s8 = RandomScales((N / 32) * (K / 32), 53);
  const PackedFp4 p4 = PackFp4({w4.data(), s4.data(), N, K});
  const PackedFp8 p8 = PackFp8({w8.data(), s8.data(), N, K, 32});
  const std::vector<float> x = RandomActs(maxM * K, 54);
  std::vector<float> y(maxM * N);
  ForEachTarget([&] {
#pragma omp parallel
    ReserveLinearScratch(maxM, K);
    for (int64_t M : {1, 4, 7, 16, 20, 33, 40, 97, 200, 300, 400}) {
      const uint64_t a0 = HeapAllocations();
      LinearFp4(x.data(), M, p4, 32, y.data());
      const uint64_t a1 = HeapAllocations();
      LinearFp8(x.data(), M, p8, 32, y.data());
      EXPECT_EQ(a1 - a0, 0u) << "LinearFp4 M=" << M;
      EXPECT_EQ(HeapAllocations() - a1, 0u) << "LinearFp8 M=" << M;
    }
  });
}

// AllocateAligned: 64-byte alignment, 2 MiB from 2 MiB up (pack.cc: huge
// pages for the packed weights), every byte writable, and sizes whose byte
// count would wrap size_t throw std::bad_alloc.
TEST(CpuKernels, AllocateAlignedAlignsAndRefusesWrappingSizes) {
  constexpr size_t kHuge = size_t{2} << 20;
  for (const size_t n : {size_t{0}, size_t{1}, kHuge / 4 - 16, kHuge / 4, kHuge / 4 + 1, 3 * kHuge / 4 + 5}) {
    AlignedArray<float> a = AllocateAligned<float>(n);
    const auto addr = reinterpret_cast<uintptr_t>(a.get());
    EXPECT_EQ(addr % 64, 0u) << n;
    if (n * sizeof(float) >= kHuge) {
      EXPECT_EQ(addr % kHuge, 0u) << n;
    }
    for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i);
    for (size_t i = 0; i < n; i += 4099) EXPECT_EQ(a[i], static_cast<float>(i));
  }
  // Only sizes the check itself refuses: a size that reaches the allocator
  // would make ASan abort (allocation-size-too-big) in the sanitizer run.
  EXPECT_THROW(AllocateAligned<uint8_t>(SIZE_MAX), std::bad_alloc);
  EXPECT_THROW(AllocateAligned<uint8_t>(SIZE_MAX - 62), std::bad_alloc);
  EXPECT_THROW(AllocateAligned<float>(SIZE_MAX / 4), std::bad_alloc);
  EXPECT_THROW(AllocateAligned<uint16_t>(SIZE_MAX / 2 - 10), std::bad_alloc);
}

// Arrays of 2 MiB or more are mappings of their own, cut to the array: no
// address space is kept for the 2 MiB alignment (posix_memalign kept up to
// 2 MiB per array mapped), the mapping ends at the array's last page, and
// freeing unmaps it.
TEST(CpuKernels, AllocateAlignedMapsLargeArraysWithoutSlack) {
  constexpr size_t kHuge = size_t{2} << 20, kPage = 4096;
  auto vm_size_kb = [] {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7));
    return -1LL;
  };
  auto mapping_end = [](uintptr_t addr) -> uintptr_t {  // end of the /proc/self/maps line holding addr
    std::ifstream f("/proc/self/maps");
    std::string line;
    while (std::getline(f, line)) {
      const size_t dash = line.find('-'), space = line.find(' ');
      const uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      if (addr >= lo && addr < hi) return hi;
    }
    return 0;
  };
  constexpr int kArrays = 32;
  const size_t n = kHuge + 100;  // bytes: 2 MiB + 100, so 2 MiB + 4 KiB mapped
  const long long before = vm_size_kb();
  ASSERT_GT(before, 0);
  std::vector<AlignedArray<uint8_t>> arrays;
  for (int i = 0; i < kArrays; ++i) arrays.push_back(AllocateAligned<uint8_t>(n));
  const long long grown = vm_size_kb() - before;
  // 32 × (2 MiB + 4 KiB) = 65 664 KiB; posix_memalign's form took ~4 MiB each (131 072 KiB).
  EXPECT_GE(grown, kArrays * static_cast<long long>((kHuge + kPage) / 1024));
  // (16 MiB of slack for the test's own heap, e.g. a sanitizer allocator's regions.)
  EXPECT_LE(grown, kArrays * static_cast<long long>((kHuge + kPage) / 1024) + 16 * 1024);
  for (auto& a : arrays) {
    const auto addr = reinterpret_cast<uintptr_t>(a.get());
    EXPECT_EQ(addr % kHuge, 0u);
    EXPECT_EQ(mapping_end(addr), addr + kHuge + kPage);  // the tail past the array's last page is unmapped
    std::memset(a.get(), 0x5A, n);
    EXPECT_EQ(a[n - 1], 0x5A);
  }
  const uintptr_t first = reinterpret_cast<uintptr_t>(arrays[0].get());
  arrays.clear();
  EXPECT_EQ(mapping_end(first), 0u);  // unmapped when freed
  EXPECT_LE(vm_size_kb() - before, 16 * 1024);
}

TEST(CpuKernels, TargetsIncludeBaseline) {
  if (std::getenv("DEEPINFER_TARGET") != nullptr) GTEST_SKIP() << "DEEPINFER_TARGET restricts the targets";
  const std::vector<int64_t> t = AvailableTargets();
  ASSERT_FALSE(t.empty());
  const std::string last = TargetName(t.back());
#ifdef DEEPINFER_NO_FALLBACK_TARGET
  // A DEEPINFER_SIMD=avx2-up|avx2 tree (the sanitizer builds): AVX2 is the baseline.
  EXPECT_EQ(last, "AVX2");
#else
  // The fallback (EMU128 or SCALAR) is always compiled and supported.
  EXPECT_TRUE(last == "EMU128" || last == "SCALAR") << last;
#endif
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

TEST(CpuKernels, LinearFp8BitIdentical) {
  WithAndWithoutBf16Dot([&] {
    ForEachTarget([&] {
      uint64_t seed = 100;
      for (const Shape& sh : kShapes) CheckFp8(sh.M, sh.N, sh.K, 32, 32, seed += 7);
      CheckFp8(5, 130, 256, 128, 128, 900);  // V4 style 128×128 blocks
      CheckFp8(3, 300, 384, 128, 128, 901);
      // M = 4 and 5: on AVX2 one 2-vector × M-row pass (linear_fp8.cc RunFp8),
      // with a 2-row last tile and a 40-row one.
      CheckFp8(4, 130, 256, 32, 32, 905);
      CheckFp8(5, 232, 160, 32, 32, 906);
      // The micro-tiles that convert whole dwords of codes (linear_fp8.cc
      // E4M3Scaled4; rows permuted in the partial sums): M = 1 and 2 with a
      // 30-row last tile (AVX2: a narrowed 4-vector column over padding),
      // M = 3 and 4 (AVX-512: 4 × 3, 4 × 4), M = 8 (6 + 2 / 3 + 3 + 2 rows).
      CheckFp8(1, 222, 256, 128, 128, 907);
      CheckFp8(2, 158, 192, 32, 32, 908);
      CheckFp8(3, 222, 128, 32, 32, 909);
      CheckFp8(4, 96, 128, 32, 32, 910);
      CheckFp8(8, 160, 128, 32, 32, 911);
      // M >= 96 (the BF16 pair-dot GEMM where supported): 128- and 64-wide
      // activation blocks, two m-chunks.
      CheckFp8(100, 130, 256, 128, 128, 902);
      CheckFp8(97, 70, 64, 64, 64, 903);
      CheckFp8(96, 64, 96, 32, 32, 904);
    });
  });
}

// An activation block that does not divide the input width is an error (it
// once overran the reference's per-block scale buffer), on both paths.
TEST(CpuKernels, QuantisedLinearsRejectActivationBlockNotDividingInput) {
  const int64_t N = 8, K = 64;
  const std::vector<uint8_t> w8 = RandomE4M3(N * K, 41);
  const std::vector<uint8_t> s8 = RandomScales(2, 42);
  const ref::Fp8Weight v8{w8.data(), s8.data(), N, K, 32};
  std::vector<uint8_t> w4(N * K / 2, 0x21), s4(N * (K / 32), 127);
  const ref::Fp4Weight v4{w4.data(), s4.data(), N, K};
  const std::vector<float> x = RandomActs(K, 43);
  std::vector<float> y(N);
  for (int ab : {48, 0, -32}) {
    EXPECT_THROW(ref::LinearFp8(x.data(), 1, v8, ab, y.data()), Error) << ab;
    EXPECT_THROW(LinearFp8(x.data(), 1, PackFp8(v8), ab, y.data()), Error) << ab;
    EXPECT_THROW(ref::LinearFp4(x.data(), 1, v4, ab, y.data()), Error) << ab;
    EXPECT_THROW(LinearFp4(x.data(), 1, PackFp4(v4), ab, y.data()), Error) << ab;
  }
  // Valid blocks still run (16 divides 64: the reference path for FP8).
  EXPECT_NO_THROW(LinearFp8(x.data(), 1, PackFp8(v8), 16, y.data()));
  EXPECT_NO_THROW(LinearFp4(x.data(), 1, PackFp4(v4), 32, y.data()));
}

TEST(CpuKernels, LinearFp8IeeeBitIdentical) {
  WithAndWithoutBf16Dot([&] {
    ForEachTarget([&] {
      uint64_t seed = 500;
      for (const Shape& sh : kShapes) CheckFp8(sh.M, sh.N, sh.K, 32, 32, seed += 7, Fp8Format::kE4M3Ieee);
      CheckFp8(5, 130, 256, 128, 128, 950, Fp8Format::kE4M3Ieee);
      CheckFp8(4, 130, 256, 32, 32, 951, Fp8Format::kE4M3Ieee);
    });
  });
}

// x: the activations (M × K), or empty for RandomActs (18 binades: every
// 32-column group holds tiny values, so every sum is order-sensitive).
void CheckFp4(int64_t M, int64_t N, int64_t K, int act_block, uint64_t seed, Fp8Format fmt = Fp8Format::kE4M3FN,
              std::vector<float> x = {}, std::vector<uint8_t> w = {}) {
  std::mt19937_64 rng(seed);
  if (w.empty()) {
    w.resize(N * K / 2);
    for (auto& b : w) b = static_cast<uint8_t>(rng());
  }
  const std::vector<uint8_t> s = RandomScales(N * (K / 32), seed + 1);
  if (x.empty()) x = RandomActs(M * K, seed + 2);
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

// The AVX2 integer dots (linear_fp4.cc BuildFp4IntActs, below 16 rows):
// groups whose nonzero |q| are all >= 2^-3 are summed exactly in integers,
// the others by the tables (the row alone) or the FP32 micro-tile, group by
// group; a micro-tile takes the integers only where all its rows can.
// Gaussian rows (a few groups with a tiny value fall back), the largest
// magnitudes (every q ±448 against every w ±6: the words' and dwords' range),
// and groups that switch between the paths inside a row and between rows.
TEST(CpuKernels, LinearFp4IntegerDotGroupsBitIdentical) {
  const int64_t N = 192, K = 1024, R = 15;
  std::mt19937_64 rng(4242);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> gauss(R * K), extreme(R * K), mixed(R * K);
  for (auto& v : gauss) v = RoundBf16(nd(rng));
  for (int64_t i = 0; i < R * K; ++i) {
    const int64_t k = i % K, g = k / 32, row = i / K;
    extreme[i] = ((i / 3) % 2 == 0 ? 448.0f : -448.0f) * (g % 3 == 0 ? 1.0f : 0.75f);
    // Each group's first value is 448 (activation scale 1, q = x). Groups
    // with g % 5 == 1, and with g % 3 == 0 in even rows, also hold 2^-12
    // (below the 2^-3 line); the others 0, −0, the edge 2^-3 itself and
    // values from 2^-3 up.
    const float big = RoundBf16(std::copysign(0.125f + std::min(std::fabs(nd(rng)) * 60.0f, 300.0f), nd(rng)));
    const bool tiny = g % 5 == 1 || (g % 3 == 0 && row % 2 == 0);
    if (k % 32 == 0) mixed[i] = 448.0f;
    else if (tiny) mixed[i] = (k % 32 == 5) ? std::ldexp(1.0f, -12) : big;
    else mixed[i] = (k % 32 == 1) ? -0.125f : (k % 32 == 2) ? -0.0f : (k % 32 == 3) ? 0.0f : big;
  }
  // Weights: every code; for the extreme rows also all ±6 (codes 7 and 15).
  std::vector<uint8_t> all6(N * K / 2);
  for (int64_t i = 0; i < N * K / 2; ++i) all6[i] = (i % 3 == 0) ? 0xF7 : (i % 3 == 1) ? 0x77 : 0xFF;
  WithAndWithoutBf16Dot([&] {
    ForEachTarget([&] {
      for (const Fp8Format fmt : {Fp8Format::kE4M3FN, Fp8Format::kE4M3Ieee}) {
        // M = 1: the GEMV; 2, 3: one micro-tile; 4, 7: micro-tiles and the
        // last row alone; 15: five micro-tiles (the most below the block GEMM).
        for (int64_t M : {1, 2, 3, 4, 7, 15}) {
          CheckFp4(M, N, K, 32, 31, fmt, {gauss.begin(), gauss.begin() + M * K});
          CheckFp4(M, N, K, 128, 32, fmt, {mixed.begin(), mixed.begin() + M * K});
          CheckFp4(M, N, K, 32, 33, fmt, {extreme.begin(), extreme.begin() + M * K}, all6);
          CheckFp4(M, N, K, 32, 34, fmt, {extreme.begin(), extreme.begin() + M * K});
        }
      }
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
  // Besides kShapes, the micro-tiles that take whole dwords of weights
  // (linear_bf16.cc LoadW2; rows permuted in the sums): M = 1 and 2 with a
  // 30-row last tile (AVX2: a narrowed 4-vector column over padding), M = 3
  // and 4 (AVX-512: 4 × 3, 4 × 4 sums), M = 8.
  std::vector<Shape> shapes = kShapes;
  for (const Shape& sh : {Shape{1, 94, 96}, Shape{2, 158, 64}, Shape{3, 222, 64}, Shape{4, 96, 64}, Shape{8, 160, 32}})
    shapes.push_back(sh);
  ForEachTarget([&] {
    uint64_t seed = 300;
    for (const Shape& sh : shapes) {
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

// Prefill-sized BF16 GEMMs: on AVX2 the block path (linear_bf16.cc
// Bf16BlockPath) with FMAs (BF16 activations) from 512 rows, multiply-then-add
// (FP32 activations) from 64; odd K (a short last block, a lone last column
// in the pair order), several m-chunks.
TEST(CpuKernels, LinearBf16BlockGemmBitIdentical) {
  ForEachTarget([&] {
    uint64_t seed = 700;
    for (const int64_t M : {64, 515}) {
      for (const int64_t K : {64, 67, 131}) {
        const int64_t N = 70;
        seed += 7;
        const std::vector<uint16_t> w = RandomBf16(N * K, seed);
        const std::vector<float> x = RandomActs(M * K, seed + 1, -8.0f, 3.0f);
        const ref::Bf16Weight view{w.data(), N, K};
        const PackedBf16 p = PackBf16(view);
        std::vector<float> want(M * N), got(M * N, -1.0f);
        ref::LinearBf16(x.data(), M, view, want.data());
        LinearBf16(x.data(), M, p, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "LinearBf16 M=" << M << " K=" << K;
        LinearBf16(x.data(), M, p, got.data(), /*pairs=*/true);
        EXPECT_TRUE(SameBits(got, RefBf16Pairs(x, M, w, N, K, K, 0, 0))) << "pairs M=" << M << " K=" << K;
        std::vector<float> xf(M * K);
        std::mt19937_64 rng(seed + 2);
        std::normal_distribution<float> nd(0.0f, 3.0f);
        for (auto& v : xf) v = nd(rng);
        ref::LinearF32Bf16W(xf.data(), M, view, want.data());
        LinearF32Bf16W(xf.data(), M, p, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "LinearF32Bf16W M=" << M << " K=" << K;
      }
    }
  });
}

// BF16 GEMM with products that underflow (activations near 2^-126) or come
// near overflow: the FMA guard (linear_common.h Bf16FmaExact) must send
// these to the multiply-then-add path; same bits as the reference.
// Cases 6 and 7: activations near 2^-120, whose products with the weights
// (2^-9 .. 2^2) are exact (FMAs allowed) but some below 2^-126: the BF16 pair
// dots (AVX-512 with AVX512_BF16, from 32 rows) would flush them, so their
// guard (Bf16PairDotsExactRanges) must refuse the call.
TEST(CpuKernels, LinearBf16ExtremeRangesBitIdentical) {
  ForEachTarget([&] {
    const int64_t N = 70, K = 96;
    for (int c = 0; c < 8; ++c) {
      const int64_t M = c < 3 ? 20 : (c < 6 ? 130 : 64);  // 130: the AVX2 BF16 block GEMM (multiply, then add)
      const int e = c < 6 ? c % 3 : 3;
      const float lo = e == 0 ? -128.0f : (e == 1 ? 110.0f : (e == 2 ? -20.0f : -121.0f)),
                  hi = e == 0 ? -110.0f : (e == 1 ? 127.0f : (e == 2 ? 20.0f : -119.0f));
      const std::vector<uint16_t> w = RandomBf16(N * K, 900 + c);
      std::vector<float> x = RandomActs(M * K, 910 + c, lo, hi);
      const ref::Bf16Weight view{w.data(), N, K};
      const PackedBf16 p = PackBf16(view);
      std::vector<float> want(M * N), got(M * N, -1.0f);
      ref::LinearBf16(x.data(), M, view, want.data());
      LinearBf16(x.data(), M, p, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "case " << c;
      if (c >= 6) {
        LinearBf16(x.data(), M, p, got.data(), /*pairs=*/true);
        EXPECT_TRUE(SameBits(got, RefBf16Pairs(x, M, w, N, K, K, 0, 0))) << "pairs, case " << c;
      }
    }
  });
}

// A subnormal weight (2^-133) against activations of 2^40: the product
// 2^-93 is exact and normal, and the pair dots' sum rule holds (-150 + 40 >=
// -112), but VDPBF16PS reads the subnormal as 0, so Bf16PairDotsExactRanges
// must refuse the call for having a subnormal operand (found by review:
// got 0 where the reference gives 2^-93). Plain, pair order and grouped.
TEST(CpuKernels, LinearBf16PairDotsRefuseSubnormalWeights) {
  const int64_t M = 32, K = 64;
  const std::vector<float> x(M * 2 * K, 0x1p40f);
  std::vector<uint16_t> w(128 * K, 0);
  w[0] = 0x0001;
  ForEachTarget([&] {
    for (const bool dots : {true, false}) {
      SetBf16Dot(dots);
      const ref::Bf16Weight view{w.data(), 1, K};
      const PackedBf16 p = PackBf16(view);
      std::vector<float> got(M, -1.0f);
      LinearBf16(x.data(), M, p, got.data());
      EXPECT_EQ(FloatBits(got[0]), FloatBits(0x1p-93f)) << "dots " << dots;
      LinearBf16(x.data(), M, p, got.data(), /*pairs=*/true);
      EXPECT_EQ(FloatBits(got[M - 1]), FloatBits(0x1p-93f)) << "pairs, dots " << dots;
      // Grouped: 2 groups of 64 rows, Kg = 64; row 0 of group 0 holds the subnormal.
      const ref::Bf16Weight gview{w.data(), 128, K};
      const PackedBf16 gp = PackBf16(gview);
      std::vector<float> gz(M * 128, -1.0f);
      GroupedLinearBf16(x.data(), M, 2, gp, gz.data());
      EXPECT_EQ(FloatBits(gz[0]), FloatBits(0x1p-93f)) << "grouped, dots " << dots;
      EXPECT_EQ(FloatBits(gz[1]), 0u) << "grouped, dots " << dots;
    }
    SetBf16Dot(true);
  });
}

// One grouped wo_a check (4 groups of R rows, Kg inputs each): the
// sequential order against ref::GroupedLinearBf16, the pair order against
// RefBf16Pairs.
void CheckGrouped(int64_t M, int64_t R, int64_t Kg, uint64_t seed, float lo, float hi) {
  const int groups = 4;
  const std::vector<uint16_t> w = RandomBf16(groups * R * Kg, seed);
  const std::vector<float> o = RandomActs(M * groups * Kg, seed + 100, lo, hi);
  const ref::Bf16Weight view{w.data(), groups * R, Kg};
  const PackedBf16 p = PackBf16(view);
  std::vector<float> want(M * groups * R), got(M * groups * R, -1.0f);
  ref::GroupedLinearBf16(o.data(), M, groups, view, want.data());
  GroupedLinearBf16(o.data(), M, groups, p, got.data());
  EXPECT_TRUE(SameBits(got, want)) << "R=" << R << " M=" << M;
  GroupedLinearBf16(o.data(), M, groups, p, got.data(), /*pairs=*/true);
  EXPECT_TRUE(SameBits(got, RefBf16Pairs(o, M, w, groups * R, Kg, groups * Kg, Kg, R)))
      << "R=" << R << " pairs M=" << M;
}

TEST(CpuKernels, GroupedLinearBf16BitIdentical) {
  ForEachTarget([&] {
    // 130 (no FMAs: random inputs), 515: the AVX2 BF16 block GEMM.
    for (int64_t M : {1, 3, 9, 20, 130, 515}) CheckGrouped(M, 64, 96, 400 + M, -6.0f, 3.0f);
    // R = 32 (tiles would straddle groups: the scalar loops), odd Kg; a wide
    // activation range so that the pair order changes some rounded outputs.
    for (int64_t M : {1, 300}) CheckGrouped(M, 32, 97, 450 + M, -10.0f, 14.0f);
  });
}

// BF16 weights that are dequantised FP8 (`wo_a`: E4M3 × the UE8M0 scale of
// its B×B block, then BF16, as the loader's DequantBf16): PackBf16 makes the
// 8-bit decode copy (PackedBf16::w8), and the calls of up to kBf16CodesMaxM
// rows that stream it give the reference's bits — the sequential and the pair
// order, FP32 output (LinearF32Bf16W), grouped; partial last tiles, row
// slices (N <= 128 with 3 threads) and every micro-tile height.
std::vector<uint16_t> DequantisedFp8(int64_t N, int64_t K, int64_t B, uint64_t seed, int scale_lo = 100,
                                     int scale_hi = 130) {
  const std::vector<uint8_t> c = RandomE4M3(N * K, seed);
  const int64_t sc = (K + B - 1) / B;
  const std::vector<uint8_t> s = RandomScales(((N + B - 1) / B) * sc, seed + 1, scale_lo, scale_hi);
  std::vector<uint16_t> w(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      w[n * K + k] = FloatToBf16(E4M3ToFloat(c[n * K + k]) * E8M0ToFloat(s[(n / B) * sc + k / B]));
  return w;
}

TEST(CpuKernels, Bf16DecodeCopyBitIdentical) {
  ForEachTarget([&] {
    uint64_t seed = 1200;
    for (const int64_t B : {32, 128}) {
      for (const Shape& sh : {Shape{1, 64, 64}, Shape{1, 94, 96}, Shape{1, 200, 160}, Shape{2, 158, 64},
                              Shape{3, 222, 64}, Shape{4, 96, 64}, Shape{5, 64, 32}, Shape{8, 160, 32},
                              Shape{16, 130, 96}, Shape{17, 70, 64}}) {
        seed += 11;
        const std::vector<uint16_t> w = DequantisedFp8(sh.N, sh.K, B, seed);
        const std::vector<float> x = RandomActs(sh.M * sh.K, seed + 2, -8.0f, 3.0f);
        const ref::Bf16Weight view{w.data(), sh.N, sh.K};
        const PackedBf16 p = PackBf16(view);
        ASSERT_TRUE(p.w8 != nullptr) << "B=" << B << " N=" << sh.N << " K=" << sh.K;
        EXPECT_LT(p.decode_bytes(), p.bytes() / 2);
        std::vector<float> want(sh.M * sh.N), got(sh.M * sh.N, -1.0f);
        ref::LinearBf16(x.data(), sh.M, view, want.data());
        LinearBf16(x.data(), sh.M, p, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "B=" << B << " M=" << sh.M << " N=" << sh.N << " K=" << sh.K;
        LinearBf16(x.data(), sh.M, p, got.data(), /*pairs=*/true);
        EXPECT_TRUE(SameBits(got, RefBf16Pairs(x, sh.M, w, sh.N, sh.K, sh.K, 0, 0))) << "pairs M=" << sh.M;
        ref::LinearF32Bf16W(x.data(), sh.M, view, want.data());
        LinearF32Bf16W(x.data(), sh.M, p, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "LinearF32Bf16W M=" << sh.M;
      }
    }
    // Grouped (wo_a's shape: 4 groups of 64 rows, 96 inputs each).
    for (const int64_t M : {1, 2, 4, 7}) {
      const int groups = 4;
      const int64_t R = 64, Kg = 96;
      const std::vector<uint16_t> w = DequantisedFp8(groups * R, Kg, 32, 1300 + M);
      const std::vector<float> o = RandomActs(M * groups * Kg, 1310 + M, -6.0f, 3.0f);
      const ref::Bf16Weight view{w.data(), groups * R, Kg};
      const PackedBf16 p = PackBf16(view);
      ASSERT_TRUE(p.w8 != nullptr);
      std::vector<float> want(M * groups * R), got(M * groups * R, -1.0f);
      ref::GroupedLinearBf16(o.data(), M, groups, view, want.data());
      GroupedLinearBf16(o.data(), M, groups, p, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "grouped M=" << M;
      GroupedLinearBf16(o.data(), M, groups, p, got.data(), /*pairs=*/true);
      EXPECT_TRUE(SameBits(got, RefBf16Pairs(o, M, w, groups * R, Kg, groups * Kg, Kg, R))) << "grouped pairs M=" << M;
    }
  });
}

// Where the decode copy cannot hold a weight exactly it is not made, and
// where a call's products or scaled activations are not exact the call
// streams the BF16 weights: the same bits either way.
TEST(CpuKernels, Bf16DecodeCopyOnlyWhereExact) {
  const int64_t N = 128, K = 64;
  // One weight with 5 significant bits (not an E4M3 value), one in a block
  // whose range is wider than E4M3's (2^-10 beside 2^8), 16-row scale blocks
  // of different scales inside one 32-row half, or too large a factor: no copy.
  std::vector<uint16_t> w = DequantisedFp8(N, K, 32, 1400);
  w[5 * K + 7] = FloatToBf16(1.0625f);
  EXPECT_TRUE(PackBf16({w.data(), N, K}).w8 == nullptr);
  w = DequantisedFp8(N, K, 32, 1400);
  w[0] = FloatToBf16(0x1p-10f);
  w[1] = FloatToBf16(256.0f);
  EXPECT_TRUE(PackBf16({w.data(), N, K}).w8 == nullptr);
  w = DequantisedFp8(N, K, 16, 1401, 100, 140);
  EXPECT_TRUE(PackBf16({w.data(), N, K}).w8 == nullptr);
  // A block factor past 2^127 (weights from 448 · 2^8: E4M3 × 2^-120 · 2^128).
  w = DequantisedFp8(N, K, 32, 1403, 135, 135);
  EXPECT_TRUE(PackBf16({w.data(), N, K}).w8 == nullptr);
  // A block of zeros (and the padding rows of a partial last tile) gets the
  // factor 1 and stays out of the range the calls check: the copy still
  // serves activations up to 2^20 here (scales 2^-27..2^-17: factors <= 2^111).
  {
    const int64_t Nz = N - 40;  // rows 88..127 of the last tile: padding
    std::vector<uint16_t> wz = DequantisedFp8(Nz, K, 32, 1404, 100, 110);
    for (int64_t n = 32; n < 64; ++n)
      for (int64_t k = 0; k < 32; ++k) wz[n * K + k] = (n + k) % 2 ? 0x8000 : 0;
    const ref::Bf16Weight vz{wz.data(), Nz, K};
    const PackedBf16 pz = PackBf16(vz);
    ASSERT_TRUE(pz.w8 != nullptr);
    EXPECT_LE(pz.s8_exp_hi, 111);
    EXPECT_EQ(PackBf16({wz.data(), Nz, 0}).w8, nullptr);  // K = 0: no copy
    ForEachTarget([&] {
      const std::vector<float> x = RandomActs(K, 1405, -4.0f, 20.0f);
      std::vector<float> want(Nz), got(Nz, -1.0f);
      ref::LinearBf16(x.data(), 1, vz, want.data());
      LinearBf16(x.data(), 1, pz, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "zero block";
    });
  }
  // Dequantised FP8 with activations whose products underflow or come near
  // overflow, or that are not BF16 values, or not finite: the copy exists,
  // the calls do not use it, and the bits are the reference's.
  ForEachTarget([&] {
    const std::vector<uint16_t> wq = DequantisedFp8(N, K, 32, 1402);
    const ref::Bf16Weight view{wq.data(), N, K};
    const PackedBf16 p = PackBf16(view);
    ASSERT_TRUE(p.w8 != nullptr);
    for (int c = 0; c < 5; ++c) {
      const int64_t M = 1 + c;
      std::vector<float> x = RandomActs(M * K, 1410 + c, c == 0 ? -128.0f : (c == 1 ? 110.0f : -8.0f),
                                        c == 0 ? -110.0f : (c == 1 ? 127.0f : 3.0f));
      if (c == 2) x[3] = 1.0f + 0x1p-20f;  // not a BF16 value
      if (c == 3) x[K + 5] = std::numeric_limits<float>::infinity();
      if (c == 4) x[1] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> want(M * N), got(M * N, -1.0f);
      ref::LinearF32Bf16W(x.data(), M, view, want.data());
      LinearF32Bf16W(x.data(), M, p, got.data());
      EXPECT_TRUE(SameBits(got, want)) << "case " << c;
    }
  });
}

// FloatsExpRange (the definition of the BF16 FMAs' and the decode copy's
// per-call guard, which the kernels compute vectorised) agrees with ExpRange::Add, its element-by-element definition, on normal,
// subnormal, zero, infinite, NaN and non-BF16 values, with a row stride.
TEST(CpuKernels, FloatsExpRangeMatchesItsDefinition) {
  std::mt19937_64 rng(77);
  const float specials[] = {0.0f, -0.0f, 0x1p-149f, -0x1p-130f, 0x1p-126f, 0x1.fep127f,
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            1.0f + 0x1p-20f, -3.5f};
  for (int c = 0; c < 200; ++c) {
    const int64_t M = 1 + c % 3, K = 1 + static_cast<int64_t>(rng() % 40), ld = K + c % 2;
    std::vector<float> x(M * ld);
    for (auto& v : x) {
      const uint64_t r = rng();
      v = r % 7 == 0 ? specials[(r >> 8) % 10]
                     : RoundBf16(std::ldexp(1.0f + (r >> 40) % 128 / 128.0f, static_cast<int>((r >> 16) % 60) - 30));
    }
    if (c % 5 == 0) std::fill(x.begin(), x.end(), c % 2 ? -0.0f : 0.0f);
    ExpRange want;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        uint32_t u;
        std::memcpy(&u, &x[m * ld + k], 4);
        want.bf16 = want.bf16 && (u & 0xFFFFu) == 0;
        want.Add(u);
      }
    const ExpRange got = FloatsExpRange(x.data(), M, K, ld);
    EXPECT_EQ(got.any_nonzero, want.any_nonzero) << c;
    EXPECT_EQ(got.finite, want.finite) << c;
    EXPECT_EQ(got.bf16, want.bf16) << c;
    if (want.any_nonzero) {
      EXPECT_EQ(got.lo, want.lo) << c;
      EXPECT_EQ(got.hi, want.hi) << c;
    }
  }
}

// ActivationExpRange (vectorised, rows over the team from 2^16 values) gives
// FloatsExpRange's result on every target and thread count: small calls, and
// calls of 70 000+ values whose one special value (or one non-BF16, one
// subnormal, one NaN) sits in a single row of one slice, all -0.0, or all
// zero but for the last rows (slices without a nonzero value merged with one
// that has some); the padding past K holds NaN and non-BF16 values, which
// must not count.
TEST(CpuKernels, ActivationExpRangeMatchesFloatsExpRange) {
  std::mt19937_64 rng(78);
  const float specials[] = {0.0f,     -0x1p-149f, 0x1p-126f, 0x1.fep127f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1.0f + 0x1p-20f, -0x1p-100f, 0x1p100f};
  const auto same = [](const ExpRange& a, const ExpRange& b) {
    return a.any_nonzero == b.any_nonzero && a.finite == b.finite && a.bf16 == b.bf16 &&
           (!a.any_nonzero || (a.lo == b.lo && a.hi == b.hi));
  };
  const int saved = NumThreads();
  ForEachTarget([&] {
    for (int th : {1, 2, 3}) {
      SetNumThreads(th);
      for (int c = 0; c < 60; ++c) {
        const bool big = c % 2 == 1;
        const int64_t M = big ? 37 + c : 1 + c % 5, K = big ? 2048 + c % 3 : 1 + static_cast<int64_t>(rng() % 70);
        const int64_t ld = K + c % 3;
        std::vector<float> x(M * ld, 0.0f);
        for (auto& v : x) v = RoundBf16(std::ldexp(1.0f + (rng() >> 40) % 128 / 128.0f, static_cast<int>(rng() % 40) - 20));
        if (c % 6 != 0) x[(rng() % M) * ld + rng() % K] = specials[c % 9];
        if (c % 10 == 4 || c % 10 == 5) std::fill(x.begin(), x.end(), -0.0f);
        if (c % 10 == 7) std::fill(x.begin(), x.begin() + (M - 2) * ld, 0.0f);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t k = K; k < ld; ++k)
            x[m * ld + k] = (k % 2) ? std::numeric_limits<float>::quiet_NaN() : 1.0f + 0x1p-20f;
        const ExpRange want = FloatsExpRange(x.data(), M, K, ld);
        EXPECT_TRUE(same(ActivationExpRange(x.data(), M, K, ld), want)) << "case " << c << " threads " << th;
      }
    }
  });
  SetNumThreads(saved);
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
