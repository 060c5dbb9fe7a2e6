// Scalar transcriptions of SLEEF's single-precision 1.0-ULP functions as built
// for AVX-512 (FMA enabled, getexp/getmant paths), torch's float row sum and
// torch's CPU top-k. Written from the published algorithms (SLEEF: Boost
// license; torch: BSD) to reproduce the reference run's bits; see ref_math.h.
#include "kernels/ref/ref_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace deepinfer::ref {
namespace {

constexpr float kRLn2f = 1.442695040888963407359924681001892137426645954152985934135449406931f;
constexpr float kL2Uf = 0.693145751953125f;
constexpr float kL2Lf = 1.428606765330187045e-06f;

inline float Bits2F(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t F2Bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// _mm512_cvtps_epi32 with the default rounding mode (nearest even); out of
// range → INT32_MIN ("integer indefinite").
inline int32_t RintI(float x) {
  if (!(x > -2147483648.0f && x < 2147483648.0f)) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(std::nearbyint(x));
}

inline float Pow2i(int32_t q) { return Bits2F(static_cast<uint32_t>(q + 0x7f) << 23); }

inline float Ldexp2(float d, int32_t e) {
  return (d * Pow2i(e >> 1)) * Pow2i(e - (e >> 1));
}

inline float Ldexp3(float d, int32_t q) {
  return Bits2F(F2Bits(d) + (static_cast<uint32_t>(q) << 23));
}

float LdexpK(float x, int32_t q) {  // vldexp_vf_vf_vi2
  int32_t m = q >> 31;
  m = (((m + q) >> 6) - m) << 4;
  q = q - (m << 2);
  m += 0x7f;
  m = m > 0 ? m : 0;
  if (m > 0xff) m = 0xff;
  float u = Bits2F(static_cast<uint32_t>(m) << 23);
  x = x * u * u * u * u;
  u = Bits2F(static_cast<uint32_t>(q + 0x7f) << 23);
  return x * u;
}

// _mm512_getexp_ps: floor(log2|x|) as a float (subnormals normalised).
inline float GetExp(float x) {
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  if (a == 0.0f) return -std::numeric_limits<float>::infinity();
  if (std::isinf(a)) return std::numeric_limits<float>::infinity();
  return static_cast<float>(std::ilogb(a));
}

// _mm512_getmant_ps(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_nan) for finite x > 0.
inline float GetMantP75(float x) {
  int e;
  float fr = std::frexp(x, &e);  // [0.5, 1)
  float sig = fr * 2.0f;         // [1, 2)
  return sig >= 1.5f ? fr : sig;
}

struct F2 { float x, y; };

inline F2 DfAdd(float x, float y) { float s = x + y; return {s, (x - s) + y}; }
inline F2 DfAdd(F2 x, float y) { float s = x.x + y; return {s, ((x.x - s) + y) + x.y}; }
inline F2 DfAdd(float x, F2 y) { float s = x + y.x; return {s, ((x - s) + y.x) + y.y}; }
inline F2 DfAdd(F2 x, F2 y) { float s = x.x + y.x; return {s, (((x.x - s) + y.x) + x.y) + y.y}; }
inline F2 DfAdd2(float x, float y) {
  float s = x + y, v = s - x;
  return {s, (x - (s - v)) + (y - v)};
}
inline F2 DfAdd2(F2 x, float y) {
  float s = x.x + y, v = s - x.x;
  float t = (x.x - (s - v)) + (y - v);
  return {s, t + x.y};
}
inline F2 DfAdd2(F2 x, F2 y) {
  float s = x.x + y.x, v = s - x.x;
  float t = (x.x - (s - v)) + (y.x - v);
  return {s, t + (x.y + y.y)};
}
inline F2 DfNormalize(F2 t) { float s = t.x + t.y; return {s, (t.x - s) + t.y}; }
inline F2 DfScale(F2 d, float s) { return {d.x * s, d.y * s}; }
inline F2 DfMul(F2 x, float y) {
  float s = x.x * y;
  return {s, std::fma(x.y, y, std::fma(x.x, y, -s))};
}
inline F2 DfMul(F2 x, F2 y) {
  float s = x.x * y.x;
  return {s, std::fma(x.x, y.y, std::fma(x.y, y.x, std::fma(x.x, y.x, -s)))};
}
inline F2 DfSqu(F2 x) {
  float s = x.x * x.x;
  return {s, std::fma(x.x + x.x, x.y, std::fma(x.x, x.x, -s))};
}
inline F2 DfDiv(F2 n, F2 d) {
  float t = 1.0f / d.x;
  float s = n.x * t;
  float u = std::fma(t, n.x, -s);
  float v = std::fma(-d.y, t, std::fma(-d.x, t, 1.0f));
  return {s, std::fma(s, v, std::fma(n.y, t, u))};
}

F2 LogKf(float d) {  // logkf, AVX-512 branch; d finite > 0
  float e = GetExp(d * (1.0f / 0.75f));
  if (std::isinf(e) && e > 0) e = 128.0f;
  const float m = GetMantP75(d);
  const F2 x = DfDiv(DfAdd2(-1.0f, m), DfAdd2(1.0f, m));
  const F2 x2 = DfSqu(x);
  float t = 0.240320354700088500976562f;
  t = std::fma(t, x2.x, 0.285112679004669189453125f);
  t = std::fma(t, x2.x, 0.400007992982864379882812f);
  const F2 c = {0.66666662693023681640625f, 3.69183861259614332084311e-09f};
  F2 s = DfMul(F2{0.69314718246459960938f, -1.904654323148236017e-09f}, e);
  s = DfAdd(s, DfScale(x, 2.0f));
  s = DfAdd(s, DfMul(DfMul(x2, x), DfAdd2(DfMul(x2, t), c)));
  return s;
}

float ExpKf(F2 d) {
  float u = (d.x + d.y) * kRLn2f;
  const int32_t q = RintI(u);
  F2 s = DfAdd2(d, static_cast<float>(q) * -kL2Uf);
  s = DfAdd2(s, static_cast<float>(q) * -kL2Lf);
  s = DfNormalize(s);
  u = 0.00136324646882712841033936f;
  u = std::fma(u, s.x, 0.00836596917361021041870117f);
  u = std::fma(u, s.x, 0.0416710823774337768554688f);
  u = std::fma(u, s.x, 0.166665524244308471679688f);
  u = std::fma(u, s.x, 0.499999850988388061523438f);
  F2 t = DfAdd(s, DfMul(DfSqu(s), u));
  t = DfAdd(1.0f, t);
  u = t.x + t.y;
  u = LdexpK(u, q);
  if (d.x < -104.0f) u = 0.0f;
  return u;
}

}  // namespace

float SleefExpf(float d) {
  const int32_t q = RintI(d * kRLn2f);
  float s = std::fma(static_cast<float>(q), -kL2Uf, d);
  s = std::fma(static_cast<float>(q), -kL2Lf, s);
  float u = 0.000198527617612853646278381f;
  u = std::fma(u, s, 0.00139304355252534151077271f);
  u = std::fma(u, s, 0.00833336077630519866943359f);
  u = std::fma(u, s, 0.0416664853692054748535156f);
  u = std::fma(u, s, 0.166666671633720397949219f);
  u = std::fma(u, s, 0.5f);
  u = 1.0f + std::fma(s * s, u, s);
  u = Ldexp2(u, q);
  if (d < -104.0f) u = 0.0f;
  if (100.0f < d) u = std::numeric_limits<float>::infinity();
  if (std::isnan(d)) u = d;
  return u;
}

float SleefLog1pf(float d) {
  if (std::isnan(d)) return d;
  if (d < -1.0f) return std::numeric_limits<float>::quiet_NaN();
  if (d == -1.0f) return -std::numeric_limits<float>::infinity();
  if (d == 0.0f && std::signbit(d)) return -0.0f;
  if (!(d <= 0x1.2ced32p+126f)) return std::log(d);  // SLEEF switches to logf_u1 there (unused range)
  const float dp1 = d + 1.0f;
  float e = GetExp(dp1 * (1.0f / 0.75f));
  if (std::isinf(e) && e > 0) e = 128.0f;
  float t = Ldexp3(1.0f, -RintI(e));
  const float m = std::fma(d, t, t - 1.0f);
  F2 s = DfMul(F2{0.69314718246459960938f, -1.904654323148236017e-09f}, e);
  const F2 x = DfDiv(F2{m, 0.0f}, DfAdd(2.0f, m));
  const float x2 = x.x * x.x;
  t = 0.3027294874e+0f;
  t = std::fma(t, x2, 0.3996108174e+0f);
  t = std::fma(t, x2, 0.6666694880e+0f);
  s = DfAdd(s, DfScale(x, 2.0f));
  s = DfAdd(s, (x2 * x.x) * t);
  return s.x + s.y;
}

float SleefPowf(float x, float y) {
  if (y == 0.0f || x == 1.0f) return 1.0f;
  if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<float>::quiet_NaN();
  if (!(x > 0.0f) || std::isinf(x) || std::isinf(y)) return std::pow(x, y);  // not used by the model
  float r = ExpKf(DfMul(LogKf(x), y));
  if (std::isnan(r)) r = std::numeric_limits<float>::infinity();
  return r;
}

namespace {

// c10::utils::CeilLog2.
int64_t CeilLog2(int64_t x) {
  if (x <= 2) return 1;
  uint64_t v = static_cast<uint64_t>(x) - 1;
  int64_t n = 0;
  while (v) { ++n; v >>= 1; }
  return n;
}

// torch's multi_row_sum<acc, 4> followed by row_sum's fold: sums `size`
// elements of stride 1 where each element is a vector of L lanes
// (element i lives at x + i*L). Returns the L-lane result in out.
template <int L>
void TorchRowSum(const float* x, int64_t size, float* out) {
  constexpr int kIlp = 4, kLevels = 4;
  const int64_t size_ilp = size / kIlp;
  float acc[kLevels][kIlp][L] = {};
  const int64_t level_power = std::max<int64_t>(4, CeilLog2(size_ilp) / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  auto add_row = [&](int64_t i) {
    for (int k = 0; k < kIlp; ++k) {
      const float* v = x + (i * kIlp + k) * L;
      for (int l = 0; l < L; ++l) acc[0][k][l] += v[l];
    }
  };
  int64_t i = 0;
  for (; i + level_step <= size_ilp;) {
    for (int64_t j = 0; j < level_step; ++j, ++i) add_row(i);
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kIlp; ++k)
        for (int l = 0; l < L; ++l) {
          acc[j][k][l] += acc[j - 1][k][l];
          acc[j - 1][k][l] = 0.0f;
        }
      const int64_t mask = level_mask << (j * level_power);
      if ((i & mask) != 0) break;
    }
  }
  for (; i < size_ilp; ++i) add_row(i);
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < kIlp; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] += acc[j][k][l];
  for (int64_t v = size_ilp * kIlp; v < size; ++v)
    for (int l = 0; l < L; ++l) acc[0][0][l] += x[v * L + l];
  for (int k = 1; k < kIlp; ++k)
    for (int l = 0; l < L; ++l) acc[0][0][l] += acc[0][k][l];
  for (int l = 0; l < L; ++l) out[l] = acc[0][0][l];
}

}  // namespace

float TorchSum(const float* x, int64_t n) {
  // torch registers its sum kernel without an AVX-512 variant (REGISTER_DISPATCH
  // leaves the AVX-512 slot empty), so AVX-512 CPUs run the AVX2 kernel:
  // Vectorized<float> has 8 lanes.
  constexpr int kLanes = 8;
  if (n < kLanes) {  // cascade_sum → scalar_inner_sum → row_sum
    float r;
    TorchRowSum<1>(x, n, &r);
    return r;
  }
  // vectorized_inner_sum: row_sum over whole vectors, then the scalar tail,
  // then the lanes in order.
  const int64_t vec_size = n / kLanes;
  float lanes[kLanes];
  TorchRowSum<kLanes>(x, vec_size, lanes);
  float final_acc = 0.0f;
  for (int64_t k = vec_size * kLanes; k < n; ++k) final_acc += x[k];
  for (int l = 0; l < kLanes; ++l) final_acc += lanes[l];
  return final_acc;
}

void TorchTopK(const float* v, int64_t n, int64_t k, bool sorted, int64_t* idx) {
  using Elem = std::pair<float, int64_t>;
  thread_local std::vector<Elem> queue;  // grows, never shrinks: no allocation per call
  if (queue.capacity() < static_cast<size_t>(n)) queue.reserve(static_cast<size_t>((n + 4095) / 4096 * 4096));
  queue.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) queue[j] = {v[j], j};
  auto comp = [](const Elem& a, const Elem& b) {
    return (std::isnan(a.first) && !std::isnan(b.first)) || (a.first > b.first);
  };
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), comp);
  } else {
    std::nth_element(queue.begin(), queue.begin() + (k - 1), queue.end(), comp);
    if (sorted) std::sort(queue.begin(), queue.begin() + (k - 1), comp);
  }
  for (int64_t j = 0; j < k; ++j) idx[j] = queue[j].second;
}

float TorchSigmoid(float x, bool vector_path) {
  if (vector_path) return 1.0f / (SleefExpf(0.0f - x) + 1.0f);
  return 1.0f / (1.0f + std::exp(-x));
}

float TorchSilu(float x) { return x / (1.0f + SleefExpf(-x)); }

float TorchSoftplus(float x) {
  if (x > 20.0f) return x;
  return SleefLog1pf(SleefExpf(x)) / 1.0f;
}

}  // namespace deepinfer::ref
