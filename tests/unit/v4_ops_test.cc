// The V4 operators (model/v4/ops.h): the fast FP8 / FP4 linears bit-identical
// to their scalar oracles on random activations and weights (several M, K up
// to 1024, all-zero and tiny blocks, extreme codes), the Hadamard butterfly
// against the Sylvester matrix (exact on integer inputs), the torch outer-sum
// cascade order, the stable top-k tie rule and the sparse attention's chunking;
// the Highway forms (ops_hwy.cc: packed FP8 / FP4 linears, Hadamard, indexer
// scoring, sparse attention) bit for bit against the scalar oracles on every
// dispatch target this CPU has, over several sizes.
#include "model/v4/ops.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"

namespace deepinfer::v4 {
namespace {

std::vector<float> RandomBf16(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = RoundBf16(d(rng));
  return v;
}

TEST(V4Ops, FastLinearsBitIdenticalToOracles) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), sc(110, 130);
  for (int64_t M : {1, 3, 17}) {
    for (int64_t K : {128, 512, 1024}) {
      const int64_t N = 256;
      std::vector<float> x = RandomBf16(rng, M * K, 3.0f);
      for (int64_t k = 0; k < 128; ++k) x[k] = 0.0f;  // an all-zero block (floor 1e-4)
      for (int64_t k = 128; k < 256 && K > 128; ++k) x[k] = 1e-30f;
      std::vector<uint8_t> w8(N * K), s8((N / 128) * (K / 128)), w4(N * K / 2), s4(N * K / 32);
      for (auto& b : w8) {
        b = static_cast<uint8_t>(byte(rng));
        if ((b & 0x7F) == 0x7F) b = 0x7E;  // no NaN codes in weights
      }
      for (auto& b : s8) b = static_cast<uint8_t>(sc(rng));
      for (auto& b : w4) b = static_cast<uint8_t>(byte(rng));
      for (auto& b : s4) b = static_cast<uint8_t>(sc(rng));
      const Fp8Weight f8{w8.data(), s8.data(), N, K};
      const Fp4Weight f4{w4.data(), s4.data(), N, K};
      std::vector<float> a(M * N), b(M * N);
      LinearFp8(x.data(), M, f8, a.data());
      LinearFp8Ref(x.data(), M, f8, b.data());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "FP8 M " << M << " K " << K;
      LinearFp4(x.data(), M, f4, a.data());
      LinearFp4Ref(x.data(), M, f4, b.data());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "FP4 M " << M << " K " << K;
    }
  }
}

// Runs body once per Highway target this CPU supports (and restores dispatch).
template <typename F>
void ForEachTarget(F&& body) {
  const std::vector<int64_t> targets = cpu::AvailableTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    cpu::ForceTarget(t);
    SCOPED_TRACE("target " + cpu::TargetName(t));
    body();
  }
  cpu::ForceTarget(0);
}

// Values of mixed magnitudes, so the FP32 sums of the fast forms round.
std::vector<float> MixedBf16(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-12, 12);
  std::vector<float> v(n);
  for (auto& x : v) x = RoundBf16(std::ldexp(d(rng), e(rng)));
  return v;
}

TEST(V4Ops, PackedBlockLinearsBitIdenticalToOracles) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255), sc(110, 130);
  ForEachTarget([&] {
    for (int64_t M : {1, 2, 3, 17}) {
      for (int64_t N : {64, 100, 256, 300}) {
        for (int64_t K : {128, 512, 1024}) {
          std::vector<float> x = MixedBf16(rng, M * K);
          for (int64_t k = 0; k < 128; ++k) x[k] = 0.0f;  // an all-zero block
          for (int64_t k = 128; k < 256 && K > 128; ++k) x[k] = 1e-30f;
          std::vector<uint8_t> w8(N * K), s8(((N + 127) / 128) * (K / 128));
          for (auto& b : w8) {
            b = static_cast<uint8_t>(byte(rng));
            if ((b & 0x7F) == 0x7F) b = 0x7E;
          }
          for (auto& b : s8) b = static_cast<uint8_t>(sc(rng));
          const Fp8Weight f8{w8.data(), s8.data(), N, K};
          const PackedFp8Weight p8 = PackFp8Weight(f8);
          ASSERT_TRUE(p8.fast);
          std::vector<float> a(M * N, -1.0f), b(M * N, -2.0f);
          LinearFp8(x.data(), M, p8, a.data());
          LinearFp8Ref(x.data(), M, f8, b.data());
          ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "M " << M << " N " << N << " K " << K;
        }
      }
    }
  });
  // FP4 (routed experts): E2M1 nibbles, per row and 32 columns UE8M0 scales.
  ForEachTarget([&] {
    for (int64_t M : {1, 2, 5}) {
      for (int64_t N : {64, 100, 512}) {
        for (int64_t K : {128, 512}) {
          std::vector<float> x = MixedBf16(rng, M * K);
          for (int64_t k = 0; k < 128; ++k) x[k] = 0.0f;
          std::vector<uint8_t> w4(N * K / 2), s4(N * K / 32);
          for (auto& b : w4) b = static_cast<uint8_t>(byte(rng));
          for (auto& b : s4) b = static_cast<uint8_t>(sc(rng));
          const Fp4Weight f4{w4.data(), s4.data(), N, K};
          const PackedFp4Weight p4 = PackFp4Weight(f4);
          ASSERT_TRUE(p4.fast);
          std::vector<float> a(M * N, -1.0f), b(M * N, -2.0f);
          LinearFp4(x.data(), M, p4, a.data());
          LinearFp4Ref(x.data(), M, f4, b.data());
          ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "FP4 M " << M << " N " << N << " K " << K;
        }
      }
    }
  });
  // A NaN weight code: the packed form is not used, the result still the oracle's.
  const int64_t N = 64, K = 128;
  std::vector<uint8_t> w8(N * K, 0x38), s8(1, 127);
  w8[5] = 0x7F;
  std::vector<float> x = MixedBf16(rng, K);
  const Fp8Weight f8{w8.data(), s8.data(), N, K};
  const PackedFp8Weight p8 = PackFp8Weight(f8);
  EXPECT_FALSE(p8.fast);
  std::vector<float> a(N), b(N);
  LinearFp8(x.data(), 1, p8, a.data());
  LinearFp8Ref(x.data(), 1, f8, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(V4Ops, FastHadamardBitIdenticalToScalar) {
  std::mt19937 rng(5);
  ForEachTarget([&] {
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}) {
      for (float scale : {1.0f, 0.0883883476f}) {
        const std::vector<float> x = MixedBf16(rng, n);
        std::vector<float> a = x, b = x;
        Hadamard(a.data(), n, scale);
        HadamardRef(b.data(), n, scale);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "n " << n;
        bool changed = false;  // the transform did something
        for (int64_t i = 0; i < n; ++i) changed |= a[i] != x[i];
        EXPECT_TRUE(changed || n == 1) << "n " << n;
      }
    }
  });
}

TEST(V4Ops, FastIndexerScoresBitIdenticalToScalar) {
  std::mt19937 rng(9);
  ForEachTarget([&] {
    for (int nh : {1, 4, 16}) {
      for (int64_t D : {16, 128}) {
        for (int64_t n : {1, 5, 63, 64, 65, 300, 1000}) {
          const std::vector<float> q = MixedBf16(rng, nh * D), keys = MixedBf16(rng, n * D),
                                   w = MixedBf16(rng, nh);
          std::vector<float> a(n + 1, 7.0f), b(n + 1, 7.0f);
          IndexerScoresRef(q.data(), w.data(), nh, D, keys.data(), n, b.data());
          // 1, 2 and 3 threads: the long lists' key chunks split over the team (n·nh·D >= 2^19).
          const int threads0 = NumThreads();
          for (int threads : {1, 2, 3}) {
            SetNumThreads(threads);
            IndexerScores(q.data(), w.data(), nh, D, keys.data(), n, a.data());
            ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
                << "nh " << nh << " D " << D << " n " << n << " threads " << threads;
          }
          SetNumThreads(threads0);
          EXPECT_EQ(a[n], 7.0f);  // nothing past n written
          int positive = 0;
          for (int64_t j = 0; j < n; ++j) positive += a[j] != 0.0f;
          if (n * nh >= 60) {  // all ReLU-zero has probability 2^-(n·nh)
            EXPECT_GT(positive, 0) << "nh " << nh << " D " << D << " n " << n;
          }
        }
      }
    }
  });
}

TEST(V4Ops, HadamardMatchesSylvesterMatrix) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> d(-8, 8);
  const int64_t n = 128;
  std::vector<float> x(n), y(n);
  for (auto& v : x) v = static_cast<float>(d(rng));
  y = x;
  Hadamard(y.data(), n, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += (__builtin_popcountll(i & j) % 2 ? -1.0 : 1.0) * x[j];
    EXPECT_EQ(y[i], RoundBf16(static_cast<float>(s))) << i;
  }
  // The scale is applied after the butterfly, then BF16.
  std::vector<float> z = x;
  Hadamard(z.data(), n, 0.25f);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(z[i], RoundBf16(y[i] * 0.25f));
}

TEST(V4Ops, OuterSumCascadeOrder) {
  // Up to 16 terms: sequential. 128 terms: 8 sequential chunks of 16, chunk sums added in order.
  std::vector<float> v(128);
  for (int i = 0; i < 128; ++i) v[i] = (i % 3 == 0 ? 1e8f : 1.0f) * (i % 2 ? -1.0f : 1.0f) + 0.1f * i;
  float seq = 0.0f;
  for (int i = 0; i < 8; ++i) seq += v[i];
  EXPECT_EQ(OuterSum(v.data(), 8), seq);
  float total = 0.0f;
  for (int c = 0; c < 8; ++c) {
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += v[c * 16 + i];
    total += s;
  }
  EXPECT_EQ(OuterSum(v.data(), 128), total);
}

TEST(V4Ops, StableTopKBreaksTiesByIndex) {
  const float v[] = {1.0f, 3.0f, 3.0f, -INFINITY, 2.0f, 3.0f};
  int64_t idx[4];
  StableTopK(v, 6, 4, idx);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 2);
  EXPECT_EQ(idx[2], 5);
  EXPECT_EQ(idx[3], 4);
}

TEST(V4Ops, FastSparseAttentionBitIdenticalToScalar) {
  std::mt19937 rng(13);
  ForEachTarget([&] {
    for (int H : {1, 4}) {
      for (int64_t D : {64, 512}) {
        for (int64_t n : {1, 40, 64, 130, 300}) {
          const std::vector<float> q = MixedBf16(rng, H * D);
          std::vector<std::vector<uint16_t>> kv(n, std::vector<uint16_t>(D));
          for (auto& r : kv) {
            const std::vector<float> v = RandomBf16(rng, D, 1.0f);
            for (int64_t c = 0; c < D; ++c) r[c] = FloatToBf16(v[c]);
          }
          std::vector<const uint16_t*> rows(n);
          for (int64_t i = 0; i < n; ++i) rows[i] = i % 7 == 3 ? nullptr : kv[i].data();  // some absent
          const std::vector<float> sink = MixedBf16(rng, H);
          std::vector<float> a(H * D, 1.0f), b(H * D, 2.0f);
          SparseAttention(q.data(), H, D, rows.data(), n, sink.data(), 0.0441941738f, a.data());
          SparseAttentionRef(q.data(), H, D, rows.data(), n, sink.data(), 0.0441941738f, b.data());
          ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "H " << H << " D " << D << " n " << n;
        }
      }
    }
  });
}

TEST(V4Ops, SparseAttentionAbsentEntriesAndChunks) {
  std::mt19937 rng(11);
  const int H = 2;
  const int64_t D = 128, n = 150;
  const std::vector<float> q = RandomBf16(rng, H * D, 0.3f);
  std::vector<std::vector<uint16_t>> kv(n, std::vector<uint16_t>(D));
  for (auto& r : kv)
    for (auto& e : r) e = FloatToBf16(RoundBf16(std::normal_distribution<float>(0, 1)(rng)));
  std::vector<const uint16_t*> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = kv[i].data();
  const float sink[2] = {0.5f, -1.0f};
  std::vector<float> a(H * D), b(H * D);
  SparseAttention(q.data(), H, D, rows.data(), n, sink, 0.088f, a.data());
  // Absent entries change nothing when they only pad the last chunk.
  std::vector<const uint16_t*> padded = rows;
  padded.resize(192, nullptr);
  SparseAttention(q.data(), H, D, padded.data(), 192, sink, 0.088f, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  // Close to a float64 softmax-with-sink (the BF16 probabilities allow ~2^-7 relative).
  for (int h = 0; h < H; ++h) {
    std::vector<double> z(n);
    double m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t c = 0; c < D; ++c) s += q[h * D + c] * Bf16ToFloat(kv[i][c]);
      z[i] = s * 0.088f;
      m = std::max(m, z[i]);
    }
    double den = std::exp(sink[h] - m);
    for (int64_t i = 0; i < n; ++i) den += std::exp(z[i] - m);
    for (int64_t c = 0; c < D; ++c) {
      double o = 0;
      for (int64_t i = 0; i < n; ++i) o += std::exp(z[i] - m) * Bf16ToFloat(kv[i][c]);
      EXPECT_NEAR(a[h * D + c], o / den, 0.02 * std::fabs(o / den) + 1e-3) << h << " " << c;
    }
  }
}

}  // namespace
}  // namespace deepinfer::v4
