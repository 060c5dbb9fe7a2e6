// Shared helpers of the CPU kernel tests (cpu_kernels_test.cc,
// cpu_model_ops_test.cc): random inputs in the ranges the kernels must handle,
// bitwise comparison, and a loop over every dispatch target this CPU runs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"

namespace deepinfer::cpu {

// Bitwise equality, any NaN equal to any NaN (payloads are not specified).
inline ::testing::AssertionResult SameBits(const std::vector<float>& got, const std::vector<float>& want) {
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
inline std::vector<float> RandomActs(int64_t n, uint64_t seed, float lo_exp = -12.0f, float hi_exp = 6.0f) {
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

inline std::vector<uint8_t> RandomE4M3(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> w(n);
  for (auto& c : w) {
    do c = static_cast<uint8_t>(rng()); while (E4M3IsNaN(c));
  }
  return w;
}

inline std::vector<uint8_t> RandomScales(int64_t n, uint64_t seed, int lo = 110, int hi = 135) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> s(n);
  for (auto& b : s) b = static_cast<uint8_t>(lo + rng() % (hi - lo + 1));
  return s;
}

inline std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed) {
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
  SetMinParallelMacs(int64_t{1} << 16);  // the default (linear_common.h)
  SetNumThreads(threads);
}

// Every FP8 and FP4 check runs with the BF16 pair-dot paths (cpu_ops.h
// Bf16DotSupported: AVX-512 CPUs with AVX512_BF16) on and off, so both
// AVX-512 paths are covered on such a CPU.
template <typename F>
void WithAndWithoutBf16Dot(F&& f) {
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "bf16 dot on" : "bf16 dot off");
    SetBf16Dot(on);
    f();
  }
  SetBf16Dot(true);
}

struct Shape {
  int64_t M, N, K;
};
inline const std::vector<Shape> kShapes = {
    {1, 64, 32}, {1, 100, 96}, {2, 130, 256}, {3, 17, 64}, {7, 64, 160}, {13, 200, 128}, {100, 70, 96}, {1, 1, 32},
    // M = 1 with more tiles than threads (no row slices): the AVX2 GEMVs over
    // whole 64-row tiles (FP8, BF16, the FP4 product tables), a 8-row last tile
    {1, 200, 160},
    // M >= 16: the block GEMM (weights converted once per tile and K block)
    {16, 64, 64}, {41, 130, 128}, {203, 24, 64}};

}  // namespace deepinfer::cpu
