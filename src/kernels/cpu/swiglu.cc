// The experts' SwiGLU elementwise steps (cpu_ops.h SwiGluClamp / SwiGluAct;
// model/v41/kernels.h SwiGlu composes them with SleefExpfRow), bit-identical
// to the scalar code they replaced: each lane does the reference's
// operations on its element in the same order (Expert.forward, model-spec
// §3.3.5): the clamps as std::max / std::min compare (a NaN operand kept),
// then silu(g)·u = (g / (1 + exp(-g)))·u, the route weight's product, BF16
// rounding last. Division and multiplication are IEEE operations on every
// target, and the build has no contraction (-ffp-contract=off).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/swiglu.cc"
#include "kernels/cpu/hwy_targets.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>

#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/hwy_util-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deepinfer::cpu {
namespace HWY_NAMESPACE {

void ClampRow(float* gate, float* up, float* neg, int64_t n, float lim) {
  const DF df;
  const VF hi = hn::Set(df, lim), lo = hn::Set(df, -lim);
  int64_t i = 0;
  for (; i + static_cast<int64_t>(kLanes) <= n; i += kLanes) {
    VF u = hn::LoadU(df, up + i), g = hn::LoadU(df, gate + i);
    if (lim > 0) {
      u = hn::IfThenElse(hn::Lt(u, lo), lo, u);  // std::max(u, -lim): (u < -lim) ? -lim : u
      u = hn::IfThenElse(hn::Lt(hi, u), hi, u);  // std::min(u, lim): (lim < u) ? lim : u
      g = hn::IfThenElse(hn::Lt(hi, g), hi, g);
    }
    hn::StoreU(u, df, up + i);
    hn::StoreU(g, df, gate + i);
    hn::StoreU(hn::Neg(g), df, neg + i);
  }
  for (; i < n; ++i) {
    float u = up[i], g = gate[i];
    if (lim > 0) {
      u = std::min(std::max(u, -lim), lim);
      g = std::min(g, lim);
    }
    up[i] = u;
    gate[i] = g;
    neg[i] = -g;
  }
}

void ActRow(float* gate, const float* up, const float* e, int64_t n, const float* w, float* out) {
  const DF df;
  const VF one = hn::Set(df, 1.0f);
  const VF vw = hn::Set(df, w ? *w : 1.0f);
  int64_t i = 0;
  for (; i + static_cast<int64_t>(kLanes) <= n; i += kLanes) {
    VF a = hn::Mul(hn::Div(hn::LoadU(df, gate + i), hn::Add(one, hn::LoadU(df, e + i))), hn::LoadU(df, up + i));
    if (w) a = hn::Mul(vw, a);
    hn::StoreU(RoundBf16V(a), df, out + i);
  }
  for (; i < n; ++i) {
    float a = (gate[i] / (1.0f + e[i])) * up[i];
    if (w) a = *w * a;
    out[i] = RoundBf16(a);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deepinfer::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deepinfer::cpu {
HWY_EXPORT(ClampRow);
HWY_EXPORT(ActRow);

void SwiGluClamp(float* gate, float* up, float* neg, int64_t n, float lim) {
  HWY_DYNAMIC_DISPATCH(ClampRow)(gate, up, neg, n, lim);
}

void SwiGluAct(float* gate, const float* up, const float* e, int64_t n, const float* w, float* out) {
  HWY_DYNAMIC_DISPATCH(ActRow)(gate, up, e, n, w, out != nullptr ? out : gate);
}

}  // namespace deepinfer::cpu
#endif  // HWY_ONCE
