#include "format/numerics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace deepinfer {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

constexpr float E4M3Value(int c) {
  const int s = (c >> 7) & 1, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 15 && m == 7) return kNaN;
  float mag = 0.0f;
  if (e == 0) {
    mag = static_cast<float>(m) / 8.0f / 64.0f;  // (m/8)·2^-6
  } else {
    float p = 1.0f;
    for (int i = 0; i < e - 7; ++i) p *= 2.0f;
    for (int i = 0; i < 7 - e; ++i) p /= 2.0f;
    mag = (1.0f + static_cast<float>(m) / 8.0f) * p;
  }
  return s ? -mag : mag;
}

constexpr std::array<float, 256> MakeE4M3Table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[c] = E4M3Value(c);
  return t;
}

constexpr std::array<float, 256> kE4M3Arr = MakeE4M3Table();

}  // namespace

const float kE4M3Table[256] = {
#define DI_E(i) kE4M3Arr[i]
#define DI_E8(i) DI_E(i), DI_E(i + 1), DI_E(i + 2), DI_E(i + 3), DI_E(i + 4), DI_E(i + 5), DI_E(i + 6), DI_E(i + 7)
#define DI_E64(i) DI_E8(i), DI_E8(i + 8), DI_E8(i + 16), DI_E8(i + 24), DI_E8(i + 32), DI_E8(i + 40), DI_E8(i + 48), DI_E8(i + 56)
    DI_E64(0), DI_E64(64), DI_E64(128), DI_E64(192)
#undef DI_E64
#undef DI_E8
#undef DI_E
};

const float kE2M1Table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

uint8_t DoubleToE4M3(double x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::min(std::fabs(x), 448.0);
  uint8_t code;
  if (a < 0.015625) {  // below 2^-6: subnormal grid m·2^-9, m = 0..8 (8 → code 0x08 = 2^-6)
    code = static_cast<uint8_t>(std::nearbyint(a * 512.0));
  } else {
    int e2;
    const double fr = std::frexp(a, &e2);  // a = fr·2^e2, fr in [0.5, 1)
    const int e = e2 - 1;                  // a = (2·fr)·2^e, 2·fr in [1, 2)
    double m = std::nearbyint((2.0 * fr - 1.0) * 8.0);  // exact: scaling by 8 is exact
    int ee = e;
    if (m >= 8.0) { m = 0.0; ++ee; }
    code = static_cast<uint8_t>(((ee + 7) << 3) | static_cast<int>(m));
  }
  return static_cast<uint8_t>(code | sign);
}

uint8_t FloatToE4M3(float x) { return DoubleToE4M3(static_cast<double>(x)); }

float E8M0ToFloat(uint8_t b) {
  if (b == 0xFF) return kNaN;
  if (b == 0) return BitsFloat(0x00400000u);  // 2^-127 (subnormal)
  return BitsFloat(static_cast<uint32_t>(b) << 23);
}

uint8_t DoubleToE2M1(double x) {
  // Midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0 between neighbouring
  // magnitudes; at a tie the upper neighbour is taken when its index is even
  // (>=), else the lower one (>). Written as a sum of comparisons so that it
  // compiles without branches (random data made the loop form mispredict).
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  double a = std::fabs(x);
  if (std::isnan(a)) a = 0.0;
  a = std::min(a, 6.0);
  const int code = static_cast<int>(a > 0.25) + static_cast<int>(a >= 0.75) + static_cast<int>(a > 1.25) +
                   static_cast<int>(a >= 1.75) + static_cast<int>(a > 2.5) + static_cast<int>(a >= 3.5) +
                   static_cast<int>(a > 5.0);
  return static_cast<uint8_t>(code | sign);
}

uint8_t FloatToE2M1(float x) { return DoubleToE2M1(static_cast<double>(x)); }

void QuantizeActE4M3(const float* x, int64_t K, int B, uint8_t* q, uint8_t* scale_e8m0) {
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float amax = 0.0f;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    amax = std::max(amax, 1e-4f);
    const uint8_t sb = Pow2CeilE8M0(amax * kInv448);
    const float s = E8M0ToFloat(sb);
    for (int i = 0; i < B; ++i) q[b0 + i] = FloatToE4M3(x[b0 + i] / s);
    scale_e8m0[b0 / B] = sb;
  }
}

void Fp8QdqInPlace(float* x, int64_t K, int B) {
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float amax = 0.0f;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    amax = std::max(amax, 1e-4f);
    const float s = E8M0ToFloat(Pow2CeilE8M0(amax * kInv448));
    for (int i = 0; i < B; ++i) x[b0 + i] = RoundBf16(E4M3ToFloat(FloatToE4M3(x[b0 + i] / s)) * s);
  }
}

void Fp4QdqUe8m0InPlace(float* x, int64_t K, int B) {
  const float floor_amax = 6.0f * std::ldexp(1.0f, -126);
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float amax = 0.0f;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    amax = std::max(amax, floor_amax);
    const float s = E8M0ToFloat(Pow2CeilE8M0(amax * kInv6));
    for (int i = 0; i < B; ++i) {
      const float v = std::clamp(x[b0 + i] / s, -6.0f, 6.0f);
      x[b0 + i] = RoundBf16(E2M1ToFloat(FloatToE2M1(v)) * s);
    }
  }
}

void Fp4QdqE4m3InPlace(float* x, int64_t K, int B) {
  const float floor_amax = 6.0f * std::ldexp(1.0f, -9);
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float amax = 0.0f;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    amax = std::max(amax, floor_amax);
    const float s = E4M3ToFloat(FloatToE4M3(amax / 6.0f));
    for (int i = 0; i < B; ++i) {
      const float v = std::clamp(x[b0 + i] / s, -6.0f, 6.0f);
      x[b0 + i] = RoundBf16(E2M1ToFloat(FloatToE2M1(v)) * s);
    }
  }
}

}  // namespace deepinfer
