// mHC collapse and expand (cpu_ops.h), bit-identical to ref::HcCollapse and
// ref::HcExpand: elementwise over the model dimension, so each SIMD lane owns
// one element i and performs the reference's operations on it in the same
// order (the stream sum in increasing j, multiply then add — the products are
// general FP32, so no FMA —, the BF16 rounding last). Rows split over the
// OpenMP team as in the reference (independent rows).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/mhc.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

// x[i] = bf16(Σ_j pre[j]·X[j][i]) for one row (X: hc streams of d).
void CollapseRow(const float* X, const float* pre, int hc, int64_t d, float* x) {
  const DF df;
  int64_t i = 0;
  for (; i + static_cast<int64_t>(kLanes) <= d; i += kLanes) {
    VF acc = hn::Zero(df);
    for (int j = 0; j < hc; ++j) acc = hn::Add(acc, hn::Mul(hn::Set(df, pre[j]), hn::LoadU(df, X + j * d + i)));
    hn::StoreU(RoundBf16V(acc), df, x + i);
  }
  for (; i < d; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < hc; ++j) acc += pre[j] * X[j * d + i];
    x[i] = RoundBf16(acc);
  }
}

// Xout[k][i] = bf16(post[k]·v[i] + Σ_j comb[j·hc + k]·X[j][i]) for one row.
void ExpandRow(const float* v, const float* X, const float* post, const float* comb, int hc, int64_t d,
               float* Xout) {
  const DF df;
  for (int k = 0; k < hc; ++k) {
    const VF pk = hn::Set(df, post[k]);
    int64_t i = 0;
    for (; i + static_cast<int64_t>(kLanes) <= d; i += kLanes) {
      VF acc = hn::Zero(df);
      for (int j = 0; j < hc; ++j)
        acc = hn::Add(acc, hn::Mul(hn::Set(df, comb[j * hc + k]), hn::LoadU(df, X + j * d + i)));
      hn::StoreU(RoundBf16V(hn::Add(hn::Mul(pk, hn::LoadU(df, v + i)), acc)), df, Xout + k * d + i);
    }
    for (; i < d; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < hc; ++j) acc += comb[j * hc + k] * X[j * d + i];
      Xout[k * d + i] = RoundBf16(post[k] * v[i] + acc);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(CollapseRow);
HWY_EXPORT(ExpandRow);

void HcCollapse(const float* X, const float* pre, int64_t M, int hc, int64_t d, float* x) {
  auto* row = HWY_DYNAMIC_DISPATCH(CollapseRow);
  ParallelFor(M, M * hc * d >= (int64_t{1} << 16),
              [&](int64_t r) { row(X + r * hc * d, pre + r * hc, hc, d, x + r * d); });
}

void HcExpand(const float* v, const float* X, const float* post, const float* comb, int64_t M, int hc, int64_t d,
              float* Xout) {
  auto* row = HWY_DYNAMIC_DISPATCH(ExpandRow);
  ParallelFor(M, M * hc * hc * d >= (int64_t{1} << 16), [&](int64_t r) {
    row(v + r * d, X + r * hc * d, post + r * hc, comb + r * hc * hc, hc, d, Xout + r * hc * d);
  });
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
