// Tests for format/numerics: exact decode tables, RNE encoders with ties,
// saturation, and the activation quantisers of model-spec §3.1(b)(g)(h)(i).
#include "format/numerics.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

// Independent formula for E4M3FN: evaluated with ldexp in double.
double E4M3Reference(int c) {
  int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -mag : mag;
}

TEST(E4M3, AllCodesDecodeExactly) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(E4M3ToFloat(c))) << c;
      EXPECT_TRUE(E4M3IsNaN(c));
      continue;
    }
    EXPECT_FALSE(E4M3IsNaN(c));
    EXPECT_EQ(static_cast<double>(E4M3ToFloat(c)), E4M3Reference(c)) << "code " << c;
  }
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_TRUE(std::signbit(E4M3ToFloat(0x80)));
}

TEST(E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(FloatToE4M3(E4M3ToFloat(c)), c) << c;
  }
}

TEST(E4M3, TiesRoundToEvenCode) {
  // Between 1.0 (0x38, m=0) and 1.125 (0x39, m=1): midpoint 1.0625 → even 0x38.
  EXPECT_EQ(FloatToE4M3(1.0625f), 0x38);
  // Between 1.125 (0x39) and 1.25 (0x3A): midpoint 1.1875 → even 0x3A.
  EXPECT_EQ(FloatToE4M3(1.1875f), 0x3A);
  // Subnormal: between 1·2^-9 (0x01) and 2·2^-9 (0x02): 1.5·2^-9 → 0x02.
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.5f, -9)), 0x02);
  // 0.5·2^-9 is the tie between 0 and the smallest subnormal → 0 (even).
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(FloatToE4M3(-std::ldexp(1.0f, -10)), 0x80);  // sign kept on zero
  // Subnormal→normal boundary: 7.5·2^-9 between 0x07 and 0x08 → 0x08 (even).
  EXPECT_EQ(FloatToE4M3(std::ldexp(7.5f, -9)), 0x08);
  // Exponent carry: 1.9375 between 1.875 (0x3F) and 2.0 (0x40) → 0x40 (even).
  EXPECT_EQ(FloatToE4M3(1.9375f), 0x40);
  // Just above a tie rounds up; just below rounds down.
  EXPECT_EQ(FloatToE4M3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(FloatToE4M3(std::nextafter(1.1875f, 0.0f)), 0x39);
}

TEST(E4M3, Saturates) {
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3(464.0f), 0x7E);  // would round to 480 (not representable) → 448
  EXPECT_EQ(FloatToE4M3(1e30f), 0x7E);
  EXPECT_EQ(FloatToE4M3(-1e30f), 0xFE);
  EXPECT_EQ(FloatToE4M3(INFINITY), 0x7E);
  EXPECT_EQ(FloatToE4M3(NAN), 0x7F);
}

TEST(E2M1, AllCodesDecodeExactly) {
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float v = E2M1ToFloat(c);
    EXPECT_EQ(std::fabs(v), mags[c & 7]);
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << c;
    EXPECT_EQ(FloatToE2M1(v), c);
  }
}

TEST(E2M1, TiesToEvenIndex) {
  // The spec's list: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4.
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(0.25f)), 0.0f);
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(0.75f)), 1.0f);
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(1.25f)), 1.0f);
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(1.75f)), 2.0f);
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(2.5f)), 2.0f);
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(3.5f)), 4.0f);
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(5.0f)), 4.0f);
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(-5.0f)), -4.0f);
  EXPECT_EQ(FloatToE2M1(-0.1f), 0x8);  // −0
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(5.01f)), 6.0f);
  EXPECT_EQ(E2M1ToFloat(FloatToE2M1(100.0f)), 6.0f);  // saturates
  uint8_t packed[1] = {0x2B};  // even element = low nibble 0xB (−1.5), odd = 0x2 (1.0)
  EXPECT_EQ(E2M1ToFloat(E2M1PackedCode(packed, 0)), -1.5f);
  EXPECT_EQ(E2M1ToFloat(E2M1PackedCode(packed, 1)), 1.0f);
}

TEST(E8M0, DecodeAndPow2Ceil) {
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(E8M0ToFloat(120), std::ldexp(1.0f, -7));
  EXPECT_EQ(E8M0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(E8M0ToFloat(255)));
  EXPECT_TRUE(E8M0IsNaN(255));
  EXPECT_EQ(Pow2CeilE8M0(1.0f), 127);        // exact power of two: no bump
  EXPECT_EQ(Pow2CeilE8M0(1.0000001f), 128);  // any mantissa bit → next power
  EXPECT_EQ(Pow2CeilE8M0(0.75f), 127);       // 0.75 → 1.0
}

TEST(Bf16, RoundNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  // 1 + 2^-8 is exactly halfway between 0x3F80 and 0x3F81 → even 0x3F80.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3·2^-8 halfway between 0x3F81 and 0x3F82 → even 0x3F82.
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(Bf16ToFloat(0xC000), -2.0f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  // Spec check values (TINY_V41_SPEC §6): embed.weight[0:4] → 3d10 bf32 bcad 3f7e.
  EXPECT_EQ(FloatToBf16(0.03503997251391411f), 0x3d10);
  EXPECT_EQ(FloatToBf16(-0.694549024105072f), 0xbf32);
  EXPECT_EQ(FloatToBf16(-0.021108264103531837f), 0xbcad);
  EXPECT_EQ(FloatToBf16(0.9909310936927795f), 0x3f7e);
}

TEST(ActQuant, HandWorkedBlockOf32) {
  // Block of 32: x = [3.0, -1.0, 0.01, 0, ...0].
  // amax = 3.0; t = 3.0 × fp32(1/448) = 0.0066964...; 2^-8 = 0.0039 < t ≤ 2^-7 = 0.0078
  // → s = 2^-7 (byte 120). q = E4M3(x/s): 3·128 = 384 → exactly representable (1.5·2^8, code 0x76);
  // (384 = 1.5·2^8: exponent field 8+7 = 15, mantissa 4 → 0x7C);
  // −128 → 0xF0 (−1·2^7); 0.01·128 = 1.28 → nearest of 1.25 (0x3A) / 1.375 (0x3B) → 1.25 = 0x3A.
  std::vector<float> x(32, 0.0f);
  x[0] = 3.0f; x[1] = -1.0f; x[2] = 0.01f;
  std::vector<uint8_t> q(32);
  uint8_t s;
  QuantizeActE4M3(x.data(), 32, 32, q.data(), &s);
  EXPECT_EQ(s, 120);
  EXPECT_EQ(q[0], 0x7C);
  EXPECT_EQ(q[1], 0xF0);
  EXPECT_EQ(q[2], 0x3A);
  EXPECT_EQ(q[3], 0x00);
}

TEST(ActQuant, FloorAt1em4AndTwoBlocks) {
  // Block 0 all zeros: amax floor 1e-4 → t = 1e-4/448 = 2.23e-7; 2^-23 = 1.19e-7 < t ≤ 2^-22
  // → s = 2^-22 (byte 105). Block 1: amax = 448 → t = 448 × fp32(1/448) = 1.0000000 exactly?
  // fp32(1/448) = 0x3B124925 = 0.002232142724096775; 448 × that = 1.0000000404 → rounds in fp32
  // to 1.0 + 2^-23·k? 448·0x3B124925 has mantissa bits set → s = 2 (byte 128); x/s = 224 → 0x77.
  std::vector<float> x(64, 0.0f);
  x[32] = 448.0f;
  std::vector<uint8_t> q(64);
  uint8_t s[2];
  QuantizeActE4M3(x.data(), 64, 32, q.data(), s);
  EXPECT_EQ(s[0], 105);
  const float t = 448.0f * kInv448;
  EXPECT_EQ(s[1], t > 1.0f ? 128 : 127);
  EXPECT_EQ(E4M3ToFloat(q[32]) * E8M0ToFloat(s[1]), 448.0f);
}

TEST(Qdq, Fp8BlockOf32) {
  // amax 5 → t = 5/448 = 0.01116; s = 2^-6 (0.015625). 5/s = 320 → representable (1.25·2^8).
  // 0.3/s = 19.2 → E4M3 grid at 16..32 has step 2 → 20 (10·2) → 20·2^-6 = 0.3125.
  std::vector<float> x(32, 0.0f);
  x[0] = 5.0f; x[1] = 0.3f;
  Fp8QdqInPlace(x.data(), 32, 32);
  EXPECT_EQ(x[0], 5.0f);
  EXPECT_EQ(x[1], 0.3125f);
}

TEST(Qdq, Fp4Ue8m0) {
  // amax 3 → t = 3 × fp32(1/6) = 3 × 0.16666667163 = 0.5000000149, which rounds to 0.5 in fp32
  // → s = 0.5 exactly (byte 126, no mantissa bits). x/s: 3/0.5 = 6 → 6·0.5 = 3;
  // 0.8/0.5 = 1.6 → nearest of {1.5, 2} → 1.5 → 0.75; −1.25/0.5 = −2.5 → tie 2|3 → even index → 2 → −1.0.
  std::vector<float> x(32, 0.0f);
  x[0] = 3.0f; x[1] = 0.8f; x[2] = -1.25f;
  ASSERT_EQ(3.0f * kInv6, 0.5f);
  Fp4QdqUe8m0InPlace(x.data(), 32);
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(x[1], 0.75f);
  EXPECT_EQ(x[2], -1.0f);
  EXPECT_EQ(x[3], 0.0f);
}

TEST(Qdq, Fp4E4m3ScaleBlockOf16) {
  // amax 6.6 → a/6 = 1.1 → E4M3 RNE: grid 1.0, 1.125 → 1.1 is nearer 1.125 → s = 1.125.
  // x/s: 6.6/1.125 = 5.8667 → 6 → 6.75; 1.0/1.125 = 0.889 → 1.0 → 1.125;
  // -2.9/1.125 = -2.578 → -3 (nearest of 2/3: 2.578 > 2.5) → -3.375.
  std::vector<float> x(16, 0.0f);
  x[0] = 6.6f; x[1] = 1.0f; x[2] = -2.9f;
  Fp4QdqE4m3InPlace(x.data(), 16);
  EXPECT_EQ(x[0], 6.75f);
  EXPECT_EQ(x[1], 1.125f);
  EXPECT_EQ(x[2], -3.375f);
  EXPECT_EQ(x[3], 0.0f);
}

}  // namespace
}  // namespace deepinfer
