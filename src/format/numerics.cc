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

float E4M3IeeeToFloat(uint8_t c) {
  if (!E4M3IeeeIsSpecial(c)) return kE4M3Table[c];
  if ((c & 7) != 0) return kNaN;
  return (c & 0x80) ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
}

uint8_t FloatToE4M3Ieee(float x) {
  if (std::isnan(x)) return 0x7F;
  return FloatToE4M3(std::clamp(x, -240.0f, 240.0f));
}

const char* Fp8FormatName(Fp8Format f) { return f == Fp8Format::kE4M3Ieee ? "e4m3-ieee" : "e4m3fn"; }

bool ParseFp8Format(std::string_view s, Fp8Format* f) {
  if (s == "e4m3fn") *f = Fp8Format::kE4M3FN;
  else if (s == "e4m3-ieee") *f = Fp8Format::kE4M3Ieee;
  else return false;
  return true;
}

uint8_t HalveE4M3(uint8_t c, bool* exact) {
  if (E4M3IsNaN(c)) {
    if (exact) *exact = true;
    return c;
  }
  const float half = E4M3ToFloat(c) * 0.5f;  // exact in FP32
  const uint8_t h = FloatToE4M3(half);
  if (exact) *exact = E4M3ToFloat(h) == half;
  return h;
}

namespace {
constexpr std::array<uint8_t, 256> MakeHalvedTable() {
  // Same rule as HalveE4M3, on the code fields (constexpr): exponent field
  // e >= 2 → e − 1; e <= 1 → the subnormal (or 0x08) code of (8e + m)/2
  // rounded half to even; NaN unchanged.
  std::array<uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int s = c & 0x80, e = (c >> 3) & 0xF, m = c & 7;
    if (e == 15 && m == 7) {
      t[c] = static_cast<uint8_t>(c);
    } else if (e >= 2) {
      t[c] = static_cast<uint8_t>(s | ((e - 1) << 3) | m);
    } else {
      const int units = 8 * e + m;  // |v| in units of 2^-9 (e = 1: 8 + m)
      int h = units / 2;
      if ((units & 1) && (h & 1)) ++h;  // tie: to the even code
      t[c] = static_cast<uint8_t>(s | h);
    }
  }
  return t;
}
constexpr std::array<uint8_t, 256> kHalvedArr = MakeHalvedTable();
}  // namespace

const uint8_t kHalvedE4M3[256] = {
#define DI_H(i) kHalvedArr[i]
#define DI_H8(i) DI_H(i), DI_H(i + 1), DI_H(i + 2), DI_H(i + 3), DI_H(i + 4), DI_H(i + 5), DI_H(i + 6), DI_H(i + 7)
#define DI_H64(i) DI_H8(i), DI_H8(i + 8), DI_H8(i + 16), DI_H8(i + 24), DI_H8(i + 32), DI_H8(i + 40), DI_H8(i + 48), DI_H8(i + 56)
    DI_H64(0), DI_H64(64), DI_H64(128), DI_H64(192)
#undef DI_H64
#undef DI_H8
#undef DI_H
};

int64_t HalveE4M3Codes(const uint8_t* in, int64_t n, uint8_t* out) {
  int64_t inexact = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t c = in[i];
    // Inexact exactly when the exponent field is 0 or 1 and the mantissa odd.
    inexact += static_cast<int64_t>((c & 0x71) == 0x01);  // fields 0000/0001, mantissa bit 0
    out[i] = kHalvedE4M3[c];
  }
  return inexact;
}

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

namespace {
// E4M3_RNE(clamp(v, ±max)): FloatToE4M3 saturates at 448 itself; the IEEE
// bound 224 is an explicit clamp (std::clamp passes NaN through → 0x7F).
inline uint8_t ClampToE4M3(float v, Fp8Format fmt) {
  if (fmt == Fp8Format::kE4M3Ieee) v = std::clamp(v, -224.0f, 224.0f);
  return FloatToE4M3(v);
}
}  // namespace

void QuantizeActE4M3(const float* x, int64_t K, int B, uint8_t* q, uint8_t* scale_e8m0, Fp8Format fmt) {
  const float inv_max = Fp8ActInvMax(fmt);
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float amax = 0.0f;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    amax = std::max(amax, 1e-4f);
    const uint8_t sb = Pow2CeilE8M0(amax * inv_max);
    const float s = E8M0ToFloat(sb);
    for (int i = 0; i < B; ++i) q[b0 + i] = ClampToE4M3(x[b0 + i] / s, fmt);
    scale_e8m0[b0 / B] = sb;
  }
}

void Fp8QdqInPlace(float* x, int64_t K, int B, Fp8Format fmt) {
  const float inv_max = Fp8ActInvMax(fmt);
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float amax = 0.0f;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    amax = std::max(amax, 1e-4f);
    const float s = E8M0ToFloat(Pow2CeilE8M0(amax * inv_max));
    for (int i = 0; i < B; ++i) x[b0 + i] = RoundBf16(E4M3ToFloat(ClampToE4M3(x[b0 + i] / s, fmt)) * s);
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

void Fp4QdqE4m3InPlace(float* x, int64_t K, int B, Fp8Format fmt) {
  const float floor_amax = 6.0f * std::ldexp(1.0f, -9);
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float amax = 0.0f;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    amax = std::max(amax, floor_amax);
    const float s = E4M3ToFloat(fmt == Fp8Format::kE4M3Ieee ? FloatToE4M3Ieee(amax / 6.0f) : FloatToE4M3(amax / 6.0f));
    for (int i = 0; i < B; ++i) {
      const float v = std::clamp(x[b0 + i] / s, -6.0f, 6.0f);
      x[b0 + i] = RoundBf16(E2M1ToFloat(FloatToE2M1(v)) * s);
    }
  }
}

}  // namespace deepinfer
