// deepinfer/vision/vit_linear_hwy.cc — see vit_linear.h. One SIMD lane per
// output column; each lane keeps the 64 partial sums of torch's 8×8 register
// block and reduces them in torch's order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vision/vit_linear_hwy.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "vision/vit_linear.h"

#include <algorithm>
#include <vector>

#ifndef DEEPINFER_VISION_VIT_LINEAR_ONCE
#define DEEPINFER_VISION_VIT_LINEAR_ONCE
namespace deepinfer::vision {
float VitDotTorchOrder(const float* x, const float* w, int64_t K, int64_t ws) {
  const int64_t la = K - K % 64, lv = K - K % 16;
  float a[64] = {};
  for (int64_t j = 0; j < la; j += 64)
    for (int t = 0; t < 64; ++t) a[t] += x[j + t] * w[(j + t) * ws];
  for (int off = 4; off >= 1; off /= 2)
    for (int i = 0; i < off; ++i)
      for (int l = 0; l < 8; ++l) a[8 * i + l] += a[8 * (i + off) + l];
  float s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
  float t[8] = {};
  for (int64_t j = la; j < lv; j += 16)
    for (int l = 0; l < 8; ++l) t[l] = (t[l] + x[j + l] * w[(j + l) * ws]) + x[j + 8 + l] * w[(j + 8 + l) * ws];
  s += ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
  for (int64_t k = lv; k < K; ++k) s += x[k] * w[k * ws];
  return s;
}

void VitLinearRowsSum4(const float* x, int64_t M, int64_t K, const float* wT, int64_t N, float* y) {
  std::vector<float> ps(static_cast<size_t>(4 * N));
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    std::fill(ps.begin(), ps.end(), 0.0f);
    int64_t k = 0;
    for (; k + 4 <= K; k += 4)
      for (int q = 0; q < 4; ++q) {
        float* p = ps.data() + q * N;
        const float xv = xr[k + q];
        const float* w = wT + (k + q) * N;
        for (int64_t n = 0; n < N; ++n) p[n] += xv * w[n];
      }
    for (; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) ps[n] += xr[k] * wT[k * N + n];
    for (int64_t n = 0; n < N; ++n) y[m * N + n] = ((ps[n] + ps[N + n]) + ps[2 * N + n]) + ps[3 * N + n];
  }
}
}  // namespace deepinfer::vision
#endif

HWY_BEFORE_NAMESPACE();
namespace deepinfer::vision {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void LinearRowsV(const float* x, int64_t M, int64_t K, const float* wT, int64_t N, float* y) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t la = K - K % 64, lv = K - K % 16;
  HWY_ALIGN float acc[64 * (HWY_MAX_BYTES / sizeof(float))];
  auto red = [&](const float* a) -> V {  // the AVX2 lane tree over 8 partial sums (vectors at a, stride L)
    auto at = [&](int i) { return hn::Load(df, a + i * L); };
    return hn::Add(hn::Add(hn::Add(at(0), at(4)), hn::Add(at(2), at(6))),
                   hn::Add(hn::Add(at(1), at(5)), hn::Add(at(3), at(7))));
  };
  int64_t n = 0;
  for (; n + L <= N; n += L)
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * K;
      for (int t = 0; t < 64; ++t) {
        V a = hn::Zero(df);
        for (int64_t j = 0; j < la; j += 64)
          a = hn::Add(a, hn::Mul(hn::Set(df, xr[j + t]), hn::LoadU(df, wT + (j + t) * N + n)));
        hn::Store(a, df, acc + t * L);
      }
      for (int off = 4; off >= 1; off /= 2)
        for (int i = 0; i < off; ++i)
          for (int l = 0; l < 8; ++l) {
            float* d = acc + (8 * i + l) * L;
            hn::Store(hn::Add(hn::Load(df, d), hn::Load(df, acc + (8 * (i + off) + l) * L)), df, d);
          }
      V s = red(acc);
      for (int l = 0; l < 8; ++l) hn::Store(hn::Zero(df), df, acc + l * L);
      for (int64_t j = la; j < lv; j += 16)
        for (int l = 0; l < 8; ++l) {
          V t = hn::Load(df, acc + l * L);
          t = hn::Add(t, hn::Mul(hn::Set(df, xr[j + l]), hn::LoadU(df, wT + (j + l) * N + n)));
          t = hn::Add(t, hn::Mul(hn::Set(df, xr[j + 8 + l]), hn::LoadU(df, wT + (j + 8 + l) * N + n)));
          hn::Store(t, df, acc + l * L);
        }
      s = hn::Add(s, red(acc));
      for (int64_t k = lv; k < K; ++k) s = hn::Add(s, hn::Mul(hn::Set(df, xr[k]), hn::LoadU(df, wT + k * N + n)));
      hn::StoreU(s, df, y + m * N + n);
    }
  for (; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = VitDotTorchOrder(x + m * K, wT + n, K, N);
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::vision
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::vision {
HWY_EXPORT(LinearRowsV);

void VitLinearRows(const float* x, int64_t M, int64_t K, const float* wT, int64_t N, float* y) {
  HWY_DYNAMIC_DISPATCH(LinearRowsV)(x, M, K, wT, N, y);
}
}  // namespace deepinfer::vision
#endif
