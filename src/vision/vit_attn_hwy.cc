// deepinfer/vision/vit_attn_hwy.cc — see vit_attn.h. One lane per key j
// (scores) or per head-dimension element e (P·V); the loop over the summed
// index stays sequential inside each lane, tails are the scalar loop.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vision/vit_attn_hwy.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "vision/vit_attn.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::vision {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void ScoresRowV(const float* q, const float* kT, int64_t n, int64_t hd, float* scores) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    auto acc = hn::Zero(df);
    for (int64_t e = 0; e < hd; ++e) acc = hn::Add(acc, hn::Mul(hn::Set(df, q[e]), hn::LoadU(df, kT + e * n + j)));
    hn::StoreU(acc, df, scores + j);
  }
  for (; j < n; ++j) {
    float acc = 0.0f;
    for (int64_t e = 0; e < hd; ++e) acc += q[e] * kT[e * n + j];
    scores[j] = acc;
  }
}

void PvRowV(const float* p, const float* v, int64_t n, int64_t hd, int64_t ldv, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t e = 0;
  for (; e + L <= hd; e += L) {
    auto acc = hn::Zero(df);
    for (int64_t j = 0; j < n; ++j) acc = hn::Add(acc, hn::Mul(hn::Set(df, p[j]), hn::LoadU(df, v + j * ldv + e)));
    hn::StoreU(acc, df, out + e);
  }
  for (; e < hd; ++e) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += p[j] * v[j * ldv + e];
    out[e] = acc;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::vision
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::vision {
HWY_EXPORT(ScoresRowV);
HWY_EXPORT(PvRowV);

void VitScoresRow(const float* q, const float* kT, int64_t n, int64_t hd, float* scores) {
  HWY_DYNAMIC_DISPATCH(ScoresRowV)(q, kT, n, hd, scores);
}

void VitPvRow(const float* p, const float* v, int64_t n, int64_t hd, int64_t ldv, float* out) {
  HWY_DYNAMIC_DISPATCH(PvRowV)(p, v, n, hd, ldv, out);
}
}  // namespace deepinfer::vision
#endif
