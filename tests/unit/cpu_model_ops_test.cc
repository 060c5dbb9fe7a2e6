// The fast CPU forms of the forward pass's non-linear operators
// (kernels/cpu/cpu_ops.h: LinearF32, Router, the mHC mixes / collapse /
// expand, SLEEF's exp, the experts' SwiGLU steps, sparse attention, the
// indexer scores) against the
// scalar reference operators: bit-identical outputs on random inputs and
// special values, on every dispatch target this CPU supports.
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

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"

#include "cpu_test_util.h"

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

// The vectorised QDQ rows (Fp8QdqRows, Fp4QdqUe8m0Rows) against the scalar
// Fp8QdqInPlace / Fp4QdqUe8m0InPlace, bit for bit, on every target: blocks
// whose values span many binades around random scales (zeros, −0,
// subnormals, the scale floors), every rounding midpoint of the E4M3 and
// E2M1 grids and its neighbours at scale 1 (block amax 448 / 6), the clamp
// (IEEE mode: 224), rows with NaN or infinity (the scalar path), and block
// lengths that leave a scalar tail (B = 20).
TEST(CpuKernels, QdqRowsBitIdentical) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  const auto random_rows = [&](int64_t M, int64_t K, int B) {
    std::vector<float> x(M * K);
    for (int64_t b0 = 0; b0 < M * K; b0 += B) {
      const int e0 = static_cast<int>(rng() % 250) - 135;
      for (int i = 0; i < B; ++i) {
        const uint64_t r = rng();
        float v = std::ldexp(mant(rng), e0 - static_cast<int>(r % 24));
        if (r % 29 == 0) v = 0.0f;
        if ((r >> 8) & 1) v = -v;
        x[b0 + i] = v;
      }
    }
    return x;
  };
  // Midpoints of a grid with `bits` mantissa bits from binade e_lo up to
  // below `top`, the subnormal spacing 2^sub below 2^e_lo, each with its two
  // float neighbours, both signs; every block led by `amax` (scale 1).
  const auto tie_rows = [&](int bits, int e_lo, int sub, float top, float amax, int B) {
    std::vector<float> v;
    for (float m = std::ldexp(0.5f, sub); m < std::ldexp(1.0f, e_lo); m += std::ldexp(1.0f, sub)) v.push_back(m);
    for (int e = e_lo; std::ldexp(1.0f, e) < top; ++e)
      for (int k = 0; k < (1 << bits); ++k) v.push_back(std::ldexp(1.0f + (k + 0.5f) / (1 << bits), e));
    std::vector<float> x;
    for (float m : v)
      for (float t : {m, std::nextafter(m, 0.0f), std::nextafter(m, 1e30f)})
        for (float sgn : {1.0f, -1.0f}) {
          if (x.size() % B == 0) x.push_back(amax);
          x.push_back(sgn * t);
        }
    while (x.size() % B != 0) x.push_back(-0.0f);
    return x;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  ForEachTarget([&] {
    for (const auto& [K, B] : std::vector<std::pair<int64_t, int>>{{64, 32}, {512, 32}, {96, 32}, {40, 20}}) {
      for (Fp8Format fmt : {Fp8Format::kE4M3FN, Fp8Format::kE4M3Ieee}) {
        std::vector<float> x = random_rows(7, K, B);
        x[3 * K + 5] = nan;  // row 3: the scalar path
        x[5 * K] = -inf;     // row 5
        std::vector<float> want = x, got = x;
        for (int64_t m = 0; m < 7; ++m) Fp8QdqInPlace(want.data() + m * K, K, B, fmt);
        Fp8QdqRows(got.data(), 7, K, B, fmt);
        EXPECT_TRUE(SameBits(got, want)) << "fp8 K=" << K << " B=" << B << " ieee=" << (fmt == Fp8Format::kE4M3Ieee);
      }
      std::vector<float> x = random_rows(7, K, B);
      x[2 * K + 1] = inf;
      std::vector<float> want = x, got = x;
      for (int64_t m = 0; m < 7; ++m) Fp4QdqUe8m0InPlace(want.data() + m * K, K, B);
      Fp4QdqUe8m0Rows(got.data(), 7, K, B);
      EXPECT_TRUE(SameBits(got, want)) << "fp4 K=" << K << " B=" << B;
    }
    for (int B : {32, 20}) {
      for (Fp8Format fmt : {Fp8Format::kE4M3FN, Fp8Format::kE4M3Ieee}) {
        const float vmax = fmt == Fp8Format::kE4M3Ieee ? 224.0f : 448.0f;
        std::vector<float> x = tie_rows(3, -6, -10, 2 * vmax, 448.0f, B);  // past 448: the clamp
        std::vector<float> want = x, got = x;
        Fp8QdqInPlace(want.data(), static_cast<int64_t>(x.size()), B, fmt);
        Fp8QdqRows(got.data(), 1, static_cast<int64_t>(x.size()), B, fmt);
        EXPECT_TRUE(SameBits(got, want)) << "fp8 ties B=" << B;
      }
      std::vector<float> x = tie_rows(1, 0, -2, 12.0f, 6.0f, B);  // past 6: the clamp
      std::vector<float> want = x, got = x;
      Fp4QdqUe8m0InPlace(want.data(), static_cast<int64_t>(x.size()), B);
      Fp4QdqUe8m0Rows(got.data(), 1, static_cast<int64_t>(x.size()), B);
      EXPECT_TRUE(SameBits(got, want)) << "fp4 ties B=" << B;
      // The ties really are rounded: some value moved, and 0.25·s went to 0.
      EXPECT_NE(std::memcmp(want.data(), x.data(), x.size() * sizeof(float)), 0);
    }
  });
}

// The experts' SwiGLU around the exp (SwiGluClamp, SwiGluAct) against the
// scalar loops they replaced, on values at and past the limit, ±0, ±Inf, NaN,
// subnormals and huge values; lengths around the vector width; no limit
// (lim <= 0) and with / without a route weight. NaN where the scalar code
// gives NaN (payloads are not specified), every other output the same bits.
TEST(CpuKernels, SwiGluStepsBitIdentical) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 6.0f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> special = {0.0f, -0.0f, 10.0f, -10.0f, std::nextafter(10.0f, 11.0f),
                                      std::nextafter(-10.0f, -11.0f), 0.5f, -0.5f, inf, -inf, nan, -nan,
                                      std::numeric_limits<float>::denorm_min(), 1e30f, -1e30f, 88.0f, -88.0f,
                                      -104.0f, std::numeric_limits<float>::max()};
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return false;
      if (!std::isnan(a[i]) && FloatBits(a[i]) != FloatBits(b[i])) return false;
    }
    return true;
  };
  for (int64_t n : {1, 7, 8, 16, 17, 31, 64, 515}) {
    std::vector<float> g0(static_cast<size_t>(n)), u0(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      g0[static_cast<size_t>(i)] = (i % 5 == 0) ? special[static_cast<size_t>(i / 5) % special.size()] : nd(rng);
      u0[static_cast<size_t>(i)] = (i % 7 == 3) ? special[static_cast<size_t>(i / 7 + 3) % special.size()] : nd(rng);
    }
    for (float lim : {10.0f, 0.5f, 0.0f, -1.0f}) {
      for (const float* w : {static_cast<const float*>(nullptr), &special[6], &special[12]}) {
        // The scalar code (model/v41/kernels.h SwiGlu before vectorising).
        std::vector<float> wg = g0, wu = u0, wn(static_cast<size_t>(n));
        for (size_t i = 0; i < wg.size(); ++i) {
          float u = wu[i], g = wg[i];
          if (lim > 0) {
            u = std::min(std::max(u, -lim), lim);
            g = std::min(g, lim);
          }
          wu[i] = u;
          wg[i] = g;
          wn[i] = ref::SleefExpf(-g);
        }
        for (size_t i = 0; i < wg.size(); ++i) {
          float a = (wg[i] / (1.0f + wn[i])) * wu[i];
          if (w) a = *w * a;
          wg[i] = RoundBf16(a);
        }
        ForEachTarget([&] {
          std::vector<float> gg = g0, gu = u0, gn(static_cast<size_t>(n));
          SwiGluClamp(gg.data(), gu.data(), gn.data(), n, lim);
          EXPECT_TRUE(same(gu, wu)) << "n " << n << " lim " << lim;
          SleefExpfRow(gn.data(), n, gn.data());
          SwiGluAct(gg.data(), gu.data(), gn.data(), n, w);
          EXPECT_TRUE(same(gg, wg)) << "n " << n << " lim " << lim << " w " << (w ? *w : 0.0f);
        });
      }
    }
  }
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
                          Case{33, 200, 575, 5}, Case{16, 520, 129, 3}, Case{5, 1, 64, 0}, Case{256, 512, 160, 3},
                          Case{17, 23, 70, 3}}) {
      // variant 0: BF16 queries (as the model's), 1: special values, 2: FP32 queries (inexact q·k products),
      // 3: in head 0 a product overflows after a large one of the other sign (multiplied then added the
      // score is +inf, fused it is 2^126: the FMA guard must refuse those scores), 4: keys near the
      // smallest normal BF16 and queries near 2^118 (ordinary scores, but pb·k underflows for the small
      // probabilities: the guard must refuse those P·V chunks; the outputs' BF16 rounding hides most
      // of such differences, so the guard's rule itself is checked in fma_exact_test), 5: keys around the
      // smallest normal BF16 (many subnormal), every third row all zero, queries near 2^-12: q·k products
      // that underflow (the keys' exponent range, subnormals counted as field 1, must refuse those blocks;
      // as in 4 the outputs hide most such differences: WidenBf16RowRange checks the ranges themselves)
      for (int variant = 0; variant < 6; ++variant) {
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
        if (variant == 3 && c.D >= 2) {
          q[0] = 0x1.8p100f, q[1] = 0x1p100f;  // × -2^27 = -1.5·2^127, then × 2^28 = 2^128
          for (int i = 0; i < n; ++i) rows[i * c.D] = FloatToBf16(-0x1p27f), rows[i * c.D + 1] = FloatToBf16(0x1p28f);
        }
        if (variant == 4) {
          for (auto& r : rows) r = FloatToBf16(Bf16ToFloat(r) * 0x1p-118f);
          for (auto& v : q) v *= 0x1p118f;
        }
        if (variant == 5) {
          for (int i = 0; i < n; ++i)
            for (int64_t d = 0; d < c.D; ++d) {
              uint16_t& r = rows[i * c.D + d];
              r = i % 3 == 2 ? uint16_t{0} : FloatToBf16(Bf16ToFloat(r) * 0x1p-127f);
            }
          for (auto& v : q) v = RoundBf16(v * 0x1p-12f);
        }
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

// The P·V guard at its edge (found by review): row 0 takes the whole
// probability (its values 0), rows 1 and 2 add exact products that cancel to
// 24447·2^-149 in d = 2, and row 3's product there has exponent sum -136, one
// below the guard's edge: it does not fit in FP32, so a fused add would round
// the sum differently (out[2] 0 instead of 0x00010000). Every target must
// multiply then add there.
TEST(CpuKernels, SparseAttentionPvGuardRefusesAnUnderflowingProduct) {
  const float q[3] = {1.0f, 1.0f, 0.0f};
  const uint16_t r0[3] = {0x0000, 0x0000, 0x0000}, r1[3] = {0xc196, 0xba48, 0x0a7d},
                 r2[3] = {0xc199, 0xbcbe, 0x8a7e}, r3[3] = {0xc19a, 0xbbcb, 0x09a7};
  const uint16_t* kv[4] = {r0, r1, r2, r3};
  const int32_t slot[4] = {0, 1, 2, 3};
  const float sink[1] = {-std::numeric_limits<float>::infinity()};
  std::vector<float> want(3);
  ref::SparseAttention(q, 1, 3, kv, slot, 4, 4, sink, 1.0f, want.data());
  EXPECT_EQ(FloatBits(want[0]), 0xb4a70000u);
  EXPECT_EQ(FloatBits(want[1]), 0xaf1f0000u);
  EXPECT_EQ(FloatBits(want[2]), 0x00010000u);
  ForEachTarget([&] {
    std::vector<float> got(3, -1.0f);
    SparseAttention(q, 1, 3, kv, slot, 4, 4, sink, 1.0f, got.data());
    EXPECT_TRUE(SameBits(got, want)) << FloatBits(got[0]) << " " << FloatBits(got[1]) << " " << FloatBits(got[2]);
  });
}

// The BF16 pair dots' guard (Bf16PairDotsExact, attention_bf16.cc) at the
// flushing edge: exact products that cancel to a subnormal partial sum, which
// VDPBF16PS would flush to 0 (the guard's field-sum rule must refuse them; on
// a CPU without the pair dots both cases run the FP32 path). Scores: row 0's
// q·k is (2^-120 + 2^-127) - 2^-120 = 2^-127, a softmax scale of 2^126 makes
// it 0.5, so a flushed score shows in every output. P·V: a zero query gives
// both rows probability 1, and d = 0 sums the same two values to 2^-127:
// out[0] = 2^-128 (BF16 0x0020), 0 if flushed. And a subnormal key element
// (the rule that operands' fields be at least 2).
TEST(CpuKernels, SparseAttentionPairDotsGuardRefusesSubnormals) {
  constexpr int64_t D = 64;
  const int32_t slot[2] = {0, 1};
  const float sink[1] = {-std::numeric_limits<float>::infinity()};
  for (const int variant : {0, 1, 2}) {
    // 0 (scores): row 0 (a, -2^-120, 0, ...), row 1 zero (score 0), q (1, 1, 0, ...).
    // 1 (P·V): rows (a, 0, ...) and (-2^-120, 0, ...), q zero.
    // 2 (a subnormal input, which VDPBF16PS reads as 0): row 0 (2^-130, 0, ...),
    // row 1 zero, q (2^20, 0, ...), scale 2^110: scores 1 and 0 (both 0 if flushed).
    const bool score_case = variant != 1;
    std::vector<uint16_t> r0(D, 0), r1(D, 0);
    std::vector<float> q(D, 0.0f);
    float scale = 1.0f;
    if (variant == 2) {
      r0[0] = 0x0008;  // 8·2^-133
      q[0] = 0x1p20f;
      scale = 0x1p110f;
    } else {
      r0[0] = FloatToBf16(0x1p-120f + 0x1p-127f);
      (score_case ? r0[1] : r1[0]) = FloatToBf16(-0x1p-120f);
      if (score_case) q[0] = q[1] = 1.0f, scale = 0x1p126f;
    }
    const uint16_t* kv[2] = {r0.data(), r1.data()};
    std::vector<float> want(D);
    ref::SparseAttention(q.data(), 1, D, kv, slot, 2, 2, sink, scale, want.data());
    if (score_case) {
      // A flushed score 0 is what a zero scale gives: both probabilities 1.
      std::vector<float> flushed(D);
      ref::SparseAttention(q.data(), 1, D, kv, slot, 2, 2, sink, 0.0f, flushed.data());
      EXPECT_NE(FloatBits(want[0]), FloatBits(flushed[0]));
    } else {
      EXPECT_EQ(FloatBits(want[0]), 0x00200000u);
    }
    for (const bool dots : {true, false}) {
      SetBf16Dot(dots);
      ForEachTarget([&] {
        std::vector<float> got(D, -1.0f);
        SparseAttention(q.data(), 1, D, kv, slot, 2, 2, sink, scale, got.data());
        EXPECT_TRUE(SameBits(got, want)) << "variant " << variant << " pair dots " << dots << ": out[0] "
                                         << FloatBits(got[0]) << " want " << FloatBits(want[0]);
      });
    }
    SetBf16Dot(true);
  }
}

// SparseAttention's key-row widening and exponent range (the FMA guard's input) against a scalar
// oracle: lengths that end inside and past the vector pairs, zeros of both signs, subnormals of every
// size, the smallest and largest normal fields, NaN and Inf, all-zero rows.
TEST(CpuKernels, WidenBf16RowRange) {
  ForEachTarget([&] {
    std::mt19937_64 rng(4242);
    for (int64_t D : {1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 128, 129, 512}) {
      for (int kind = 0; kind < 9; ++kind) {
        std::vector<uint16_t> src(D);
        for (auto& b : src) {
          const uint16_t sign = (rng() & 1) ? 0x8000 : 0;
          switch (kind) {
            case 0: b = static_cast<uint16_t>(rng()); break;                                  // anything
            case 1: b = sign; break;                                                            // ±0 only
            case 2: b = static_cast<uint16_t>(sign | (rng() % 3 == 0 ? 1 + rng() % 127 : 0)); break;  // subnormals
            case 3: b = static_cast<uint16_t>(sign | (rng() % 4 ? 0 : 0x0080 + rng() % 128)); break;  // field 1
            case 4: b = static_cast<uint16_t>(sign | ((100 + rng() % 60) << 7) | (rng() & 0x7F)); break;
            case 5: b = static_cast<uint16_t>(sign | (rng() % 2 ? 0x7F80 : 0x7F80 | (1 + rng() % 127))); break;  // Inf/NaN
            case 6: b = static_cast<uint16_t>(sign | (rng() % 8 ? 0 : 0x0001)); break;        // the smallest subnormal
            case 7: b = static_cast<uint16_t>(sign | ((1 + rng() % 254) << 7) | (rng() & 0x7F)); break;
            default: b = static_cast<uint16_t>(sign | (rng() % 16 ? 0 : (rng() % 2 ? 0x7F7F : 0x0080))); break;
          }
        }
        if (kind == 3 || kind == 6) src[rng() % D] = 0x0001;  // one subnormal somewhere: field 1 either way
        int32_t want_min = 255, want_max = 0;
        for (uint16_t b : src)
          if ((b & 0x7FFF) != 0) {
            const int32_t e = (b >> 7) & 0xFF;
            want_min = std::min(want_min, std::max(e, 1));
            want_max = std::max(want_max, e);
          }
        std::vector<float> dst(D + 1, 42.0f);
        int32_t emin = -1, emax = -1;
        WidenBf16Row(src.data(), D, dst.data(), &emin, &emax);
        EXPECT_EQ(emin, want_min) << "D=" << D << " kind=" << kind;
        EXPECT_EQ(emax, want_max) << "D=" << D << " kind=" << kind;
        int64_t bad = 0;
        for (int64_t d = 0; d < D; ++d) bad += FloatBits(dst[d]) != static_cast<uint32_t>(src[d]) << 16;
        EXPECT_EQ(bad, 0) << "D=" << D << " kind=" << kind;
        EXPECT_EQ(FloatBits(dst[D]), FloatBits(42.0f)) << "wrote past D=" << D;
        if (D % 2 == 0 && Bf16DotSupported()) {
          // The pair dots' rows (bf16_dot.h AttnKeyPairsRow): the same range, element 2p high.
          std::vector<uint32_t> pairs(D / 2 + 1, 42u);
          int32_t pmin = -1, pmax = -1;
          AttnKeyPairsRow(src.data(), D, pairs.data(), &pmin, &pmax);
          EXPECT_EQ(pmin, want_min) << "pairs D=" << D << " kind=" << kind;
          EXPECT_EQ(pmax, want_max) << "pairs D=" << D << " kind=" << kind;
          int64_t bad_pairs = 0;
          for (int64_t p = 0; p < D / 2; ++p)
            bad_pairs += pairs[p] != ((static_cast<uint32_t>(src[2 * p]) << 16) | src[2 * p + 1]);
          EXPECT_EQ(bad_pairs, 0) << "pairs D=" << D << " kind=" << kind;
          EXPECT_EQ(pairs[D / 2], 42u) << "pairs wrote past D=" << D;
        }
      }
    }
  });
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
  for (int64_t n : {1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 129, 300, 1000})
    cases.push_back({16, 128, n, 0});
  cases.push_back({64, 128, 250, 0});  // the large preset's decode shape (2^21 multiply-adds: four chunks)
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
      // The one-row form: packing and scoring split over 1, 2 and 3 threads (the key chunks of the
      // long lists land on different threads), into a buffer whose padding starts as NaN.
      {
        std::vector<uint16_t> kbits(E * ID);
        std::vector<const uint16_t*> rows(E);
        for (int64_t t = 0; t < E * ID; ++t) kbits[t] = static_cast<uint16_t>(FloatBits(keys[t]) >> 16);
        for (int64_t j = 0; j < E; ++j) rows[j] = kbits.data() + j * ID;
        const int threads0 = NumThreads();
        for (int threads : {1, 2, 3}) {
          SetNumThreads(threads);
          std::vector<float> kt2(kt.size(), std::numeric_limits<float>::quiet_NaN()), got2(n + 1, 42.0f);
          PackAndScoreIndexKeys(q.data(), w.data(), nh, ID, rows.data(), n, kt2.data(), got2.data());
          EXPECT_EQ(FloatBits(got2[n]), FloatBits(42.0f)) << "wrote past n=" << n;
          int64_t bad2 = 0;
          for (int64_t j = 0; j < n; ++j) bad2 += FloatBits(got2[j]) != FloatBits(want[j]);
          EXPECT_EQ(bad2, 0) << "PackAndScoreIndexKeys, " << threads << " threads, nh=" << nh << " n=" << n
                             << " special=" << cs.special;
          for (int64_t t = 0; t < n * ID && t < static_cast<int64_t>(kt.size()); ++t) {  // the packed keys too
            const int64_t j = t / ID, c = t % ID, at = (j / kIndexKeyBlock) * kIndexKeyBlock * ID + c * kIndexKeyBlock + j % kIndexKeyBlock;
            if (FloatBits(kt2[at]) != FloatBits(kt[at])) {
              ADD_FAILURE() << "packed key " << j << " element " << c << " differs";
              break;
            }
          }
        }
        SetNumThreads(threads0);
      }
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
