// Unit tests of the V4.1 reference operators, state geometry and Engram hashing
// that need no checkpoint (the golden end-to-end tests are v41_golden_test.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "format/numerics.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"
#include "model/config.h"
#include "model/state.h"
#include "model/v41/engram.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
const fs::path kData = fs::path(DEEPINFER_TEST_DATA);

ModelConfig TinyConfig() {
  std::ifstream f(kData / "tiny_v41_config.json");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return ModelConfig::FromJsonText(text, "tiny_v41_config.json");
}

// ------------------------------------------------------------------ state

TEST(V41State, GeometryFromTinyConfig) {
  const ModelConfig c = TinyConfig();
  const StateGeometry g = StateGeometry::FromConfig(c, 16);
  const auto& win = g.of(StateKind::kWindow).regions;
  ASSERT_EQ(win.size(), 8u);
  EXPECT_EQ(win[3].layer, 3);
  EXPECT_EQ(win[3].row_bytes, 128 * 2);
  EXPECT_EQ(win[3].rows_per_block, 16);
  const auto& ckv = g.of(StateKind::kCompressedKv).regions;
  ASSERT_EQ(ckv.size(), 2u);  // KV sources 2 (ratio 2) and 4 (ratio 1)
  EXPECT_EQ(ckv[0].layer, 2);
  EXPECT_EQ(ckv[0].rows_per_block, 8);
  EXPECT_EQ(ckv[1].layer, 4);
  EXPECT_EQ(ckv[1].rows_per_block, 16);
  EXPECT_EQ(g.of(StateKind::kIndexKey).regions[1].row_bytes, 128 * 2);
  const auto& carry = g.of(StateKind::kCompressorCarry).regions;
  ASSERT_EQ(carry.size(), 1u);
  EXPECT_EQ(carry[0].layer, 2);
  EXPECT_EQ(carry[0].row_bytes, 2 * 128 * 4);
  EXPECT_EQ(carry[0].rows_per_block, 1);
  ASSERT_EQ(g.of(StateKind::kEngram).regions.size(), 1u);
  EXPECT_EQ(g.of(StateKind::kEngram).regions[0].rows_per_block, 2);
  // 890 B/token-style accounting on the tiny model: (8 + 16) rows of 256 + 256 B per 16-token block.
  EXPECT_EQ(g.PagedBytesPerBlock(), 2 * (8 + 16) * 256);
  EXPECT_EQ(g.FixedBytesPerSlot(), 8 * 16 * 256 + 1024 + 8);
  EXPECT_EQ(g.BlocksForTokens(33), 3);
  try {
    StateGeometry::FromConfig(c, 15);
    ADD_FAILURE() << "odd block size accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("multiple of compress ratio 2"), std::string::npos) << e.what();
  }
}

TEST(V41State, DenseArenaRowsAreDisjointAndResettable) {
  const ModelConfig c = TinyConfig();
  const StateGeometry g = StateGeometry::FromConfig(c, 16);
  DenseStateArena arena(g, 2, 4);
  const int32_t t0[2] = {0, 3}, t1[2] = {2, 1};
  SequenceStateView a = arena.View(0, t0, 2), b = arena.View(1, t1, 2);
  const int ckv = g.of(StateKind::kCompressedKv).RegionOf(4);
  // Ratio-1 region: row 17 is block 1, row 1 of it → physical block t[1].
  EXPECT_EQ(a.Row(StateKind::kCompressedKv, ckv, 17) - a.Row(StateKind::kCompressedKv, ckv, 0),
            (3 * 16 + 1) * 256);
  EXPECT_NE(a.Row(StateKind::kWindow, 5, 3), b.Row(StateKind::kWindow, 5, 3));
  std::memset(a.Row(StateKind::kWindow, 5, 3), 0xAB, 256);
  std::memset(b.Row(StateKind::kWindow, 5, 3), 0xCD, 256);
  EXPECT_EQ(a.Row(StateKind::kWindow, 5, 3)[0], 0xAB);
  arena.ResetSlot(0);
  EXPECT_EQ(a.Row(StateKind::kWindow, 5, 3)[0], 0);
  EXPECT_EQ(b.Row(StateKind::kWindow, 5, 3)[0], 0xCD);
}

// ------------------------------------------------------------------ Engram

TEST(V41Engram, MultipliersAreShippedDataAndUnknownOnesAreAnError) {
  EXPECT_EQ(v41::EngramMultipliers(1, 99092, 3),
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349}));
  EXPECT_EQ(v41::EngramMultipliers(14, 99092, 4),
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  // Every multiplier is odd and keeps id·m below 2^63 (model-spec §3.3.2).
  for (int layer : {1, 2, 14})
    for (int64_t m : v41::EngramMultipliers(layer, 99092, layer == 2 ? 3 : 4)) {
      EXPECT_EQ(m % 2, 1);
      EXPECT_LT(m, (INT64_MAX / 99092) + 1);
    }
  try {
    v41::EngramMultipliers(3, 99092, 3);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("layer 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(v41::EngramMultipliers(2, 99092, 4), Error);  // only 3 known for the tiny layer 2
}

// Hash ids of the golden debug prompt from the token map and the config alone.
TEST(V41Engram, HashIdsMatchTheReference) {
  const ModelConfig c = TinyConfig();
  const fs::path g = kData / "golden-tiny-v41";
  v41::EngramHasher h(c, v41::LoadEngramTokenMap(g / "engram_token_map.i32"));
  std::ifstream f(g / "golden.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  const auto prompt = j["prompts"][j["debug"]["prompt_index"].get<int>()]["prompt"].get<std::vector<int32_t>>();
  const auto want = j["debug"]["engram_hash_ids"].get<std::vector<std::vector<std::vector<int64_t>>>>();
  ASSERT_EQ(want.size(), prompt.size());
  std::vector<int64_t> ids(h.n_layers() * h.cols());
  for (size_t p = 0; p < prompt.size(); ++p) {
    int32_t hist[3];
    for (int s = 0; s < 3; ++s) hist[s] = p >= static_cast<size_t>(s) ? prompt[p - s] : -1;
    h.Hash(hist, ids.data());
    for (int L = 0; L < h.n_layers(); ++L)
      for (int k = 0; k < h.cols(); ++k) EXPECT_EQ(ids[L * h.cols() + k], want[p][L][k]) << "pos " << p;
  }
}

TEST(V41Engram, RejectsAMapOfTheWrongVocabulary) {
  const ModelConfig c = TinyConfig();
  std::vector<int32_t> map(129280, 0);
  for (size_t i = 0; i < map.size(); ++i) map[i] = static_cast<int32_t>(i % 1000);
  try {
    v41::EngramHasher h(c, map);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1000 distinct compressed ids, expected 99092"), std::string::npos)
        << e.what();
  }
}

// ------------------------------------------------------------------ maths

TEST(V41RefMath, TorchSumIsExactWhenEveryPartialIsAndFollowsTorchOrder) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  double exact = 0;
  for (float v : x) exact += v;
  for (int64_t n : {1, 3, 7, 8, 9, 24, 64, 256, 1000}) {
    double e = 0;
    for (int64_t i = 0; i < n; ++i) e += x[i];
    EXPECT_EQ(ref::TorchSum(x.data(), n), static_cast<float>(e)) << n;
  }
  // Order, scalar path (n < 8): row_sum keeps 4 partials {x0, x1, x2, x3},
  // adds the tail x4, x5 to partial 0, then folds partials 1..3 into it. With
  // x4 = 2^24 every later +1 is lost to rounding: 2^24 (a left-to-right sum
  // would give 2^24 + 4).
  std::vector<float> w = {1.0f, 1.0f, 1.0f, 1.0f, 16777216.0f, 1.0f};
  EXPECT_EQ(ref::TorchSum(w.data(), 6), 16777216.0f);
  // Vector path (n = 16): 8 lanes, lane l = x[l] + x[l+8], lanes then added in
  // order. x0 = 2^24 and fifteen 1s: lane 0 = 2^24 (+1 lost), lanes 1..7 = 2,
  // each added exactly: 2^24 + 14. A left-to-right sum loses every 1: 2^24.
  std::vector<float> y(16, 1.0f);
  y[0] = 16777216.0f;
  EXPECT_EQ(ref::TorchSum(y.data(), 16), 16777230.0f);
}

TEST(V41RefMath, SleefExpIsWithinOneUlpOfExpAndExactOnSimpleValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-80.0f, 80.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng);
    const float r = ref::SleefExpf(x);
    const double e = std::exp(static_cast<double>(x));
    const float ulp = std::nextafter(static_cast<float>(e), INFINITY) - static_cast<float>(e);
    EXPECT_LE(std::fabs(r - e), 1.0 * ulp) << x;
  }
  EXPECT_EQ(ref::SleefExpf(0.0f), 1.0f);
  EXPECT_EQ(ref::SleefExpf(-200.0f), 0.0f);
  EXPECT_EQ(ref::SleefExpf(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isinf(ref::SleefExpf(200.0f)));
  for (float x : {1e-3f, 0.5f, 3.0f, 1e4f}) {
    const double e = std::log1p(static_cast<double>(x));
    EXPECT_NEAR(ref::SleefLog1pf(x), e, 2e-7 * e) << x;
  }
  for (int k = 0; k < 32; ++k) {
    const double e = std::pow(160000.0, k / 32.0);
    EXPECT_NEAR(ref::SleefPowf(160000.0f, static_cast<float>(2 * k) / 64.0f), e, 2e-7 * e) << k;
  }
}

TEST(V41RefMath, TopKBreaksTiesLikeLibstdcxx) {
  // Ties at zero are common in the V4.1 indexer (ReLU); the pick among equal
  // values must be deterministic and equal to nth_element's on (value, index).
  std::vector<float> v = {0, 0.5f, 0, 0, 0.25f, 0, 0, 0, -INFINITY, -INFINITY};
  std::vector<int64_t> idx(4);
  ref::TorchTopK(v.data(), static_cast<int64_t>(v.size()), 4, false, idx.data());
  std::vector<std::pair<float, int64_t>> q;
  for (size_t i = 0; i < v.size(); ++i) q.push_back({v[i], static_cast<int64_t>(i)});
  std::nth_element(q.begin(), q.begin() + 3, q.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (int i = 0; i < 4; ++i) EXPECT_EQ(idx[i], q[i].second);
  std::vector<int64_t> sorted_idx = idx;
  std::sort(sorted_idx.begin(), sorted_idx.end());
  EXPECT_TRUE(std::find(idx.begin(), idx.end(), 1) != idx.end());
  EXPECT_TRUE(std::find(idx.begin(), idx.end(), 4) != idx.end());
  // Large arrays (k·64 <= n) take the partial_sort path, sorted descending.
  std::vector<float> big(200);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>((i * 37) % 101);
  std::vector<int64_t> top(3);
  ref::TorchTopK(big.data(), 200, 3, true, top.data());
  EXPECT_EQ(big[top[0]], 100.0f);
  EXPECT_EQ(big[top[1]], 100.0f);
  EXPECT_EQ(big[top[2]], 99.0f);
}

// ------------------------------------------------------------------ operators

TEST(V41RefOps, SparseAttentionMatchesSoftmaxWithSinkAcrossManyChunks) {
  // 200-slot list (4 chunks of 64, the last partial) with absent slots, 3 heads.
  const int H = 3;
  const int64_t D = 64;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(H * D);
  for (auto& v : q) v = RoundBf16(nd(rng));
  const int32_t list_len = 200;
  std::vector<std::vector<uint16_t>> rows;
  std::vector<int32_t> slots;
  for (int32_t s = 0; s < list_len; ++s) {
    if (s % 7 == 3 || (s >= 64 && s < 128 && s % 2)) continue;  // absent
    std::vector<uint16_t> r(D);
    for (auto& v : r) v = FloatToBf16(nd(rng) * (s % 5 == 0 ? 3.0f : 1.0f));
    rows.push_back(r);
    slots.push_back(s);
  }
  std::vector<const uint16_t*> ptr;
  for (auto& r : rows) ptr.push_back(r.data());
  const float sink[H] = {0.5f, -1.0f, 2.0f};
  const float scale = 1.0f / 8.0f;
  std::vector<float> out(H * D);
  ref::SparseAttention(q.data(), H, D, ptr.data(), slots.data(), static_cast<int>(ptr.size()), list_len, sink,
                       scale, out.data());
  for (int h = 0; h < H; ++h) {
    std::vector<double> z(ptr.size());
    double mx = -1e300;
    for (size_t i = 0; i < ptr.size(); ++i) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[h * D + d]) * Bf16ToFloat(ptr[i][d]);
      z[i] = dot * scale;
      mx = std::max(mx, z[i]);
    }
    double den = std::exp(sink[h] - mx);
    for (double v : z) den += std::exp(v - mx);
    for (int64_t d = 0; d < D; ++d) {
      double num = 0;
      for (size_t i = 0; i < ptr.size(); ++i) num += std::exp(z[i] - mx) * Bf16ToFloat(ptr[i][d]);
      const double want = num / den;
      // BF16 probabilities and output: a few BF16 ulps of the output's scale.
      EXPECT_NEAR(out[h * D + d], want, 0.02 * std::fabs(want) + 2e-3) << "h " << h << " d " << d;
    }
  }
}

TEST(V41RefOps, RopeYarnTableFollowsTheSpec) {
  // Ratio > 0 table: base 160000, YaRN f=16 over indices low=15 .. high=25 (model-spec §1.2, §3.1c).
  ref::RopeTable t(64, 160000.0, 65536, 16.0, 32.0, 1.0);
  for (int k = 0; k < 32; ++k) {
    const double theta = 1.0 / std::pow(160000.0, 2.0 * k / 64.0);
    const double ramp = std::clamp((k - 15.0) / 10.0, 0.0, 1.0);
    const double want = theta / 16.0 * ramp + theta * (1.0 - ramp);
    EXPECT_NEAR(t.theta()[k], want, 4e-7 * want) << k;
  }
  ref::RopeTable plain(64, 10000.0, 0, 16.0, 32.0, 1.0);
  EXPECT_EQ(plain.theta()[0], 1.0f);
  // Rotating by +p then −p restores the input to BF16 rounding.
  float x[64], y[64];
  for (int i = 0; i < 64; ++i) x[i] = y[i] = RoundBf16(std::sin(0.37f * i));
  plain.Apply(y, 123, false);
  EXPECT_NE(std::memcmp(x, y, sizeof(x)), 0);
  plain.Apply(y, 123, true);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(y[i], x[i], 0.02f) << i;
  // Pair (x0, x1) at position 1 rotates by θ0 = 1 radian.
  float v[64] = {};
  v[0] = 1.0f;
  plain.Apply(v, 1, false);
  EXPECT_EQ(v[0], RoundBf16(std::cos(1.0f)));
  EXPECT_EQ(v[1], RoundBf16(std::sin(1.0f)));
}

TEST(V41RefOps, RopeApplyHeadsIsApplyPerHead) {
  // Three heads of 80 values with the rotated 64 at offset 16 (as the
  // attention's heads), both directions, the YaRN table and the plain one:
  // the bits of one Apply per head, and the values between heads untouched.
  for (const ref::RopeTable& t : {ref::RopeTable(64, 160000.0, 65536, 16.0, 32.0, 1.0),
                                  ref::RopeTable(64, 10000.0, 0, 16.0, 32.0, 1.0)})
    for (bool inverse : {false, true}) {
      constexpr int64_t kHeads = 3, kStride = 80;
      std::vector<float> want(kHeads * kStride), got;
      for (size_t i = 0; i < want.size(); ++i) want[i] = RoundBf16(std::cos(0.11f * static_cast<float>(i)) * 3.0f);
      got = want;
      for (int64_t h = 0; h < kHeads; ++h) t.Apply(want.data() + h * kStride + 16, 4097, inverse);
      t.ApplyHeads(got.data() + 16, kHeads, kStride, 4097, inverse);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << inverse;
      EXPECT_NE(got[16], RoundBf16(std::cos(0.11f * 16.0f) * 3.0f));  // rotated
    }
}

TEST(V41RefOps, Fp8LinearMatchesDequantisedProductWithinBf16) {
  // 64×96 FP8 weight with block scales, activations quantised per 32.
  const int64_t N = 64, K = 96, M = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wf(N * K);
  for (auto& v : wf) v = nd(rng) * 0.1f;
  std::vector<uint8_t> wq(N * K), ws((N / 32) * (K / 32));
  for (int64_t bo = 0; bo < N / 32; ++bo)
    for (int64_t bi = 0; bi < K / 32; ++bi) {
      float amax = 0;
      for (int64_t o = 0; o < 32; ++o)
        for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(wf[(bo * 32 + o) * K + bi * 32 + i]));
      const uint8_t sb = Pow2CeilE8M0(amax * kInv448);
      ws[bo * (K / 32) + bi] = sb;
      for (int64_t o = 0; o < 32; ++o)
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t at = (bo * 32 + o) * K + bi * 32 + i;
          wq[at] = FloatToE4M3(wf[at] / E8M0ToFloat(sb));
        }
    }
  std::vector<float> x(M * K);
  for (auto& v : x) v = RoundBf16(nd(rng));
  std::vector<float> y(M * N);
  ref::LinearFp8(x.data(), M, ref::Fp8Weight{wq.data(), ws.data(), N, K, 32}, 32, y.data());
  for (int64_t m = 0; m < M; ++m) {
    std::vector<uint8_t> q(K), s(K / 32);
    QuantizeActE4M3(x.data() + m * K, K, 32, q.data(), s.data());
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<double>(E4M3ToFloat(q[k]) * E8M0ToFloat(s[k / 32])) *
               (E4M3ToFloat(wq[n * K + k]) * E8M0ToFloat(ws[(n / 32) * (K / 32) + k / 32]));
      EXPECT_NEAR(y[m * N + n], acc, std::fabs(acc) * (1.0 / 128) + 1e-4) << m << "," << n;
      EXPECT_EQ(y[m * N + n], RoundBf16(y[m * N + n]));
    }
  }
}

}  // namespace
}  // namespace deepinfer
