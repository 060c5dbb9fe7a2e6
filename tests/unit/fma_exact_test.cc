// The exactness argument that lets the CPU kernels use fused multiply-adds
// without changing a bit (kernels/cpu/cpu_ops.h): fma(a, b, c) rounds a·b + c
// once, a multiply then an add rounds a·b first; the two agree for every c
// whenever a·b is exact in FP32. Checked here over every code pair the
// kernels multiply: E4M3 × E4M3 (FP8 linears), E2M1 × E4M3 (FP4 experts), in
// the reference's units and in the kernels' scaled operand units (q·2^119 ×
// w·2^-120), and BF16 × BF16 over all significand pairs at exponent pairs
// covering the whole range, including where the product stops being exact
// (which the BF16 kernels' guard excludes: kernels/cpu/linear_common.h
// Bf16FmaExact).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "format/numerics.h"
#include "kernels/cpu/linear_common.h"

namespace deepinfer {
namespace {

// a·b is exact in FP32: the float product equals the (exact) double product.
bool ProductExact(float a, float b) {
  const float p = a * b;
  return static_cast<double>(p) == static_cast<double>(a) * static_cast<double>(b);
}

// fma(a, b, c) == a·b + c (multiply, then add; -ffp-contract=off) bit for bit.
bool FmaSameAsMulAdd(float a, float b, float c) {
  const float sep = a * b + c;
  const float fused = std::fma(a, b, c);
  return FloatBits(sep) == FloatBits(fused) || (std::isnan(sep) && std::isnan(fused));
}

// Accumulators: zero, -0, values whose ulp is far above / below / near the
// product, the largest finite, subnormals.
std::vector<float> Accumulators(uint64_t seed, int n) {
  std::vector<float> c = {0.0f, -0.0f, 1.0f, -3.0e-5f, 6.1e4f, 0x1p-149f, -0x1p-130f, 3.4e38f, -1.0e-20f};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> e(-40.0f, 40.0f), u(1.0f, 2.0f);
  while (static_cast<int>(c.size()) < n)
    c.push_back(std::ldexp(u(rng), static_cast<int>(e(rng))) * ((rng() & 1) ? -1.0f : 1.0f));
  return c;
}

TEST(FmaExact, E4M3TimesE4M3EveryCodePair) {
  const std::vector<float> acc = Accumulators(1, 24);
  int64_t pairs = 0, not_exact = 0, fma_differs = 0;
  for (int i = 0; i < 256; ++i) {
    if (E4M3IsNaN(static_cast<uint8_t>(i))) continue;
    const float a = E4M3ToFloat(static_cast<uint8_t>(i));
    for (int j = 0; j < 256; ++j) {
      if (E4M3IsNaN(static_cast<uint8_t>(j))) continue;
      const float b = E4M3ToFloat(static_cast<uint8_t>(j));
      ++pairs;
      // Reference units, and the kernels' scaled operands (a = activation
      // q·2^119, b = weight ·2^-120: the product is a·b/2).
      const float qa = a * cpu::kActOperandScale, wb = b * 0x1p-120f;
      if (!ProductExact(a, b) || !ProductExact(qa, wb) || qa * wb != (a * b) * 0.5f) ++not_exact;
      for (float c : acc) fma_differs += !FmaSameAsMulAdd(a, b, c) + !FmaSameAsMulAdd(qa, wb, c);
    }
  }
  EXPECT_EQ(pairs, 254 * 254);
  EXPECT_EQ(not_exact, 0);
  EXPECT_EQ(fma_differs, 0);
}

TEST(FmaExact, E2M1TimesE4M3EveryCodePair) {
  const std::vector<float> acc = Accumulators(2, 24);
  int64_t pairs = 0, not_exact = 0, fma_differs = 0;
  for (int i = 0; i < 16; ++i) {
    const float w = E2M1ToFloat(static_cast<uint8_t>(i));
    for (int j = 0; j < 256; ++j) {
      if (E4M3IsNaN(static_cast<uint8_t>(j))) continue;
      const float q = E4M3ToFloat(static_cast<uint8_t>(j));
      ++pairs;
      const float qa = q * cpu::kActOperandScale, wb = w * 0x1p-120f;
      if (!ProductExact(q, w) || !ProductExact(qa, wb) || qa * wb != (q * w) * 0.5f) ++not_exact;
      for (float c : acc) fma_differs += !FmaSameAsMulAdd(q, w, c) + !FmaSameAsMulAdd(qa, wb, c);
    }
  }
  EXPECT_EQ(pairs, 16 * 254);
  EXPECT_EQ(not_exact, 0);
  EXPECT_EQ(fma_differs, 0);
}

// Every pair of BF16 significands (and signs) at exponent pairs (ea, eb)
// spread over the whole range: exact exactly when ea + eb >= -135 (the
// product's lowest bit is at or above 2^-149) and ea + eb <= 125 (no
// overflow), which is the guard's condition; below it some products are
// not exact and an FMA would differ.
// One operand pair against a guard's verdict: accepted pairs must be exact
// with FMA == multiply then add for every accumulator (else counted in
// *bad); refused pairs that do round or overflow are counted in *refused_inexact.
void Tally(float a, float b, bool guard, const std::vector<float>& acc, int64_t* accepted, int64_t* bad,
           int64_t* refused_inexact) {
  const bool exact = std::isfinite(a * b) && ProductExact(a, b);
  if (guard) {
    ++*accepted;
    bool ok = exact;
    for (float c : acc) ok = ok && FmaSameAsMulAdd(a, b, c);
    *bad += !ok;
  } else {
    *refused_inexact += !exact;
  }
}

TEST(FmaExact, Bf16TimesBf16SignificandPairsOverTheExponentRange) {
  const std::vector<float> acc = Accumulators(3, 6);
  std::vector<int> exps;
  for (int e = -126; e <= 127; e += 7) exps.push_back(e);
  exps.push_back(127);
  int64_t in_range = 0, in_range_bad = 0, out_range_inexact = 0;
  for (int ea : exps) {
    for (int eb : exps) {
      const int s = ea + eb;
      const bool guard = s >= cpu::kBf16FmaMinExpSum && s <= cpu::kBf16FmaMaxExpSum;
      // Only the exponent pairs near the guard's edges, and a few inside.
      if (!(s >= -140 && s <= -130) && !(s >= 120 && s <= 128) && (s + 126) % 41 != 0) continue;
      for (int ma = 0; ma < 256; ++ma) {
        const float a = std::ldexp(1.0f + (ma & 127) / 128.0f, ea) * ((ma & 128) ? -1.0f : 1.0f);
        for (int mb = 0; mb < 128; ++mb) {
          const float b = std::ldexp(1.0f + mb / 128.0f, eb);
          ASSERT_EQ(RoundBf16(a), a);
          ASSERT_EQ(RoundBf16(b), b);
          Tally(a, b, guard, acc, &in_range, &in_range_bad, &out_range_inexact);
        }
      }
    }
  }
  EXPECT_GT(in_range, 1000000);
  EXPECT_EQ(in_range_bad, 0);
  // The guard is needed: outside it products do round (or overflow).
  EXPECT_GT(out_range_inexact, 1000);
}

// The sparse attention's form of the guard (exponent fields, a BF16
// subnormal's field 0 counted as 1): every product it accepts is exact and
// FMA == multiply then add, subnormal operands included; one step past
// either edge it refuses, and there products do round or overflow.
TEST(FmaExact, Bf16FieldsGuardHoldsForSubnormalsAndNormals) {
  const std::vector<float> acc = Accumulators(5, 6);
  // Operand sets by exponent field: all 127 positive BF16 subnormals (field
  // 0), and every significand of a normal field f.
  auto values = [](int field) {
    std::vector<float> v;
    for (int m = field == 0 ? 1 : 0; m < 128; ++m)
      v.push_back(Bf16ToFloat(static_cast<uint16_t>((field << 7) | m)));
    return v;
  };
  int64_t accepted = 0, bad = 0, refused_inexact = 0;
  for (int fa : {0, 1, 2}) {
    // Fields of b around the lower edge for this a: (max(fa,1) - 127) + (fb - 127) = -135 ± 2.
    const int edge = 254 - 135 - std::max(fa, 1);
    for (int fb = edge - 2; fb <= edge + 2; ++fb) {
      const bool guard = cpu::Bf16FieldsProductsExact(fa == 0 ? 1 : fa, fa == 0 ? 1 : fa, fb, fb);
      EXPECT_EQ(guard, fb >= edge) << fa << " " << fb;
      for (float a : values(fa))
        for (float b : values(fb)) Tally(a, b, guard, acc, &accepted, &bad, &refused_inexact);
    }
  }
  // The upper edge: fields summing to 254 + 125 accepted, from one more refused (one margin step: at
  // 254 + 127 a product overflows).
  EXPECT_TRUE(cpu::Bf16FieldsProductsExact(200, 200, 179, 179));
  EXPECT_FALSE(cpu::Bf16FieldsProductsExact(200, 200, 180, 180));
  EXPECT_FALSE(std::isfinite(Bf16ToFloat(static_cast<uint16_t>((200 << 7) | 127)) *
                             Bf16ToFloat(static_cast<uint16_t>((181 << 7) | 127))));
  EXPECT_FALSE(cpu::Bf16FieldsProductsExact(100, 255, 100, 100));  // Inf / NaN
  EXPECT_GT(accepted, 40000);
  EXPECT_EQ(bad, 0);
  EXPECT_GT(refused_inexact, 1000);
}

// Control: for general FP32 operands an FMA does differ, so the comparisons
// above can fail.
TEST(FmaExact, GeneralFp32ProductsDiffer) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int differ = 0;
  for (int i = 0; i < 10000; ++i) differ += !FmaSameAsMulAdd(u(rng), u(rng), u(rng));
  EXPECT_GT(differ, 1000);
}

}  // namespace
}  // namespace deepinfer
