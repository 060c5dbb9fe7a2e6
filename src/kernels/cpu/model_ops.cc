// Router and mHC mixes with their long dot products on the fast kernels
// (cpu_ops.h "non-GEMM ops"). The per-row tails are the reference's code
// (kernels/ref/ref_ops.cc; the mHC one is ref::HcMixesTail itself); only the
// logits / mixes matmul moved.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/parallel.h"
#include "format/numerics.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/ref_ops.h"

namespace deepinfer::cpu {

void Router(const float* x, int64_t M, const PackedBf16& gate, const float* const* bias, int topk, float gate_temp,
            bool norm_topk_prob, float route_scale, const int32_t* softplus_vec, int32_t* indices, float* weights) {
  if (M <= 0) return;
  const int64_t E = gate.src.out;
  thread_local std::vector<float> logits_buf;  // the calling thread's (no allocation per step)
  logits_buf.assign(static_cast<size_t>(M * E), 0.0f);
  const float* const logits = logits_buf.data();
  LinearF32Bf16W(x, M, gate, logits_buf.data());  // acc = Σ_k x·w in increasing k (ref::Router's loop)
  ParallelFor(M, true, [&](int64_t m) {
    thread_local std::vector<float> s, sel;  // grow, never shrink: no allocation per step
    thread_local std::vector<int64_t> idx;
    if (s.size() < static_cast<size_t>(E)) s.resize(static_cast<size_t>(E));
    if (sel.size() < static_cast<size_t>(E)) sel.resize(static_cast<size_t>(E));
    if (idx.size() < static_cast<size_t>(topk)) idx.resize(static_cast<size_t>(topk));
    for (int64_t e = 0; e < E; ++e) {
      const float acc = logits[m * E + e];
      const float logit = acc / gate_temp;
      const float sp = e < softplus_vec[m] ? ref::TorchSoftplus(logit)
                                           : (logit > 20.0f ? logit : std::log1p(std::exp(logit)));
      s[e] = std::sqrt(sp);
      sel[e] = s[e] + bias[m][e];
    }
    ref::TorchTopK(sel.data(), E, topk, /*sorted=*/true, idx.data());
    float* wr = weights + m * topk;
    for (int i = 0; i < topk; ++i) {
      indices[m * topk + i] = static_cast<int32_t>(idx[i]);
      wr[i] = s[idx[i]];
    }
    if (norm_topk_prob && topk > 1) {
      const float denom = ref::TorchSum(wr, topk) + 1e-20f;
      for (int i = 0; i < topk; ++i) wr[i] = wr[i] / denom;
    }
    for (int i = 0; i < topk; ++i) wr[i] = wr[i] * route_scale;
  });
}

void HcMixes(const float* X, int64_t M, int hc, int64_t d, const PackedF32& fn, const float* base,
             const float* scale, float norm_eps, int sinkhorn_iters, float hc_eps, const int32_t* sig_vec,
             float* pre, float* post, float* comb) {
  if (M <= 0) return;
  const int64_t flat = hc * d;
  const int64_t mix = (2 + hc) * hc;
  thread_local std::vector<float> dots_buf;  // the calling thread's (no allocation per step)
  dots_buf.assign(static_cast<size_t>(M * mix), 0.0f);
  const float* const dots = dots_buf.data();
  LinearF32(X, M, fn, dots_buf.data());  // Σ_i f[i]·w[j][i] in increasing i (ref::HcMixes's loop)
  ParallelFor(M, true, [&](int64_t r) {
    thread_local std::vector<float> sq, mixes, rs, cs;  // grow, never shrink: no allocation per step
    if (sq.size() < static_cast<size_t>(flat)) sq.resize(static_cast<size_t>(flat));
    if (mixes.size() < static_cast<size_t>(mix)) mixes.resize(static_cast<size_t>(mix));
    if (rs.size() < static_cast<size_t>(hc)) rs.resize(static_cast<size_t>(hc));
    if (cs.size() < static_cast<size_t>(hc)) cs.resize(static_cast<size_t>(hc));
    const float* f = X + r * flat;
    for (int64_t i = 0; i < flat; ++i) sq[i] = f[i] * f[i];
    const float rsq = 1.0f / std::sqrt(ref::TorchSum(sq.data(), flat) / static_cast<float>(flat) + norm_eps);
    for (int64_t j = 0; j < mix; ++j) mixes[j] = dots[r * mix + j] * rsq;
    ref::HcMixesTail(mixes.data(), hc, base, scale, sinkhorn_iters, hc_eps, sig_vec[r], rs.data(), cs.data(),
                     pre + r * hc, post + r * hc, comb + r * hc * hc);
  });
}

}  // namespace deepinfer::cpu
