// The prefill block GEMM of the FP8/FP4 linears (kernels/cpu/hwy_util-inl.h
// RunBlockItems: weights converted once per (tile, K block), activations
// packed in groups of the micro-tile height) against the scalar reference,
// bit for bit, on every compiled target, at the shapes where the packing and
// the micro-tile tails meet: M not a multiple of the group height, M one
// past an m-chunk (96), N not a multiple of 64 (and below one micro
// column), K of a single block, 128-wide activation blocks (klen 128), and
// 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
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
                                    {101, 64, 64, 32}, {200, 72, 160, 32}, {20, 130, 256, 128}, {50, 24, 384, 128}};

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

}  // namespace
}  // namespace deepinfer::cpu
